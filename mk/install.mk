# mk/install.mk — `make install` / `make uninstall`, as C users expect.
#
#   make install   [PREFIX=/usr/local] [DESTDIR=staging] [LIBDIR=...] [MANDIR=...]
#   make uninstall [the same variables]
#
# Installs (and uninstall removes exactly these, nothing else):
#   $(BINDIR)/flashattn                          the CLI
#   $(INCLUDEDIR)/flashattn.h                    the whole public API
#   $(LIBDIR)/libflashattn.a                     static library
#   $(LIBDIR)/libflashattn.so.MAJOR.MINOR.PATCH  shared library, soname libflashattn.so.SOVERSION
#                                                (0.MINOR while MAJOR is 0, else MAJOR: see Makefile)
#   $(LIBDIR)/libflashattn.so.SOVERSION          the soname link (what programs load)
#   $(LIBDIR)/libflashattn.so                    the link-time link (what -lflashattn finds)
#   $(LIBDIR)/pkgconfig/flashattn.pc             for `pkg-config --cflags --libs flashattn`
#   $(MANDIR)/man1/flashattn.1                   the man page (its .TH line given
#                                                this version from the header)
# The .pc file is written at install time for the PREFIX/LIBDIR given then.
# DESTDIR only prefixes the copies (staging for a package); paths written into
# flashattn.pc never contain it. After a plain install as root into /usr/lib or
# /usr/local/lib, ldconfig refreshes the loader's cache so the soname is found.

BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR     ?= $(PREFIX)/share/man
PCDIR      ?= $(LIBDIR)/pkgconfig
INSTALL    ?= install

SO_REAL    := libflashattn.so.$(VERSION)

# Static linking needs what the library itself links: OpenMP's runtime and libm.
PC_LIBS_PRIVATE = $(strip $(OMPFLAGS) -lm)

INSTALLED_FILES = $(BINDIR)/flashattn $(INCLUDEDIR)/flashattn.h $(LIBDIR)/libflashattn.a \
                  $(LIBDIR)/$(SO_REAL) $(LIBDIR)/$(SONAME) $(LIBDIR)/libflashattn.so \
                  $(PCDIR)/flashattn.pc $(MANDIR)/man1/flashattn.1

.PHONY: install uninstall

# Install paths are split on spaces by the recipes (`rm -f $(DIR)/x` with DIR
# "/tmp/a b" removes /tmp/a): refuse a path with whitespace, and a relative one
# (flashattn.pc would carry it and work only from this directory), before any
# file is touched.
ifneq ($(filter install uninstall,$(MAKECMDGOALS)),)
empty :=
space := $(empty) $(empty)
tab   := $(empty)	$(empty)
INSTALL_PATH_VARS = PREFIX DESTDIR BINDIR LIBDIR INCLUDEDIR MANDIR PCDIR
$(foreach v,$(INSTALL_PATH_VARS),$(if $(findstring $(space),$(value $(v)))$(findstring $(tab),$(value $(v))),\
    $(error make install: $(v)="$(value $(v))" contains whitespace; choose a path without spaces)))
$(foreach v,$(filter-out DESTDIR,$(INSTALL_PATH_VARS)),$(if $(filter /%,$($(v))),,\
    $(error make install: $(v)=$($(v)) is not an absolute path; give one starting with /)))
endif

# A path of the .pc relative to ${prefix} where it lies under it.
pc_path = $(if $(filter $(PREFIX)/%,$(1)),$${prefix}/$(patsubst $(PREFIX)/%,%,$(1)),$(1))

$(BUILD)/flashattn.pc: FORCE
	@mkdir -p $(dir $@)
	@printf '%s\n' \
	    'prefix=$(PREFIX)' \
	    'libdir=$(call pc_path,$(LIBDIR))' \
	    'includedir=$(call pc_path,$(INCLUDEDIR))' \
	    '' \
	    'Name: flashattn' \
	    'Description: Exact attention on CPUs, computed the FlashAttention way' \
	    'Version: $(VERSION)' \
	    'Cflags: -I$${includedir}' \
	    'Libs: -L$${libdir} -lflashattn' \
	    'Libs.private: $(PC_LIBS_PRIVATE)' >$@.tmp && mv $@.tmp $@

.PHONY: FORCE
FORCE:

install: all $(BUILD)/flashattn.pc
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
	    $(DESTDIR)$(PCDIR) $(DESTDIR)$(MANDIR)/man1
	$(INSTALL) -m 755 $(BUILD)/flashattn $(DESTDIR)$(BINDIR)/flashattn
	$(INSTALL) -m 644 include/flashattn.h $(DESTDIR)$(INCLUDEDIR)/flashattn.h
	$(INSTALL) -m 644 $(BUILD)/libflashattn.a $(DESTDIR)$(LIBDIR)/libflashattn.a
	$(INSTALL) -m 755 $(BUILD)/libflashattn.so $(DESTDIR)$(LIBDIR)/$(SO_REAL)
	ln -sf $(SO_REAL) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libflashattn.so
	$(INSTALL) -m 644 $(BUILD)/flashattn.pc $(DESTDIR)$(PCDIR)/flashattn.pc
	sed '/^\.TH /s/"flashattn [0-9.]*"/"flashattn $(VERSION)"/' docs/flashattn.1 >$(BUILD)/flashattn.1
	$(INSTALL) -m 644 $(BUILD)/flashattn.1 $(DESTDIR)$(MANDIR)/man1/flashattn.1
	@case "$(DESTDIR):$(LIBDIR)" in :/usr/lib|:/usr/local/lib) \
	    [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null 2>&1 && ldconfig 2>/dev/null || true;; esac
	@echo "install: flashattn $(VERSION) in $(DESTDIR)$(PREFIX)"

uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED_FILES))
	@echo "uninstall: removed flashattn $(VERSION) from $(DESTDIR)$(PREFIX)"
