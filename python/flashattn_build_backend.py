"""flashattn_build_backend.py — the PEP 517 build backend of `pip install ./python`.

Approach: the Python module is a ctypes wrapper, so a wheel is just two files
in a package — ``flashattn/__init__.py`` (this directory's flashattn.py) and
``flashattn/libflashattn.so`` built by the project's own Makefile — plus the
``.dist-info`` metadata that PEP 427 asks for. Writing that zip needs only the
standard library, so this backend has no build requirements at all: pip's
isolated build environment installs nothing and needs no network, and
``--no-build-isolation`` works on a machine without setuptools or wheel.
(A setuptools backend was rejected for that reason: setuptools before 70.1
needs the separate ``wheel`` package, which is not on every machine, and
fetching it needs the network.)

Where the C sources are: a checkout has them one directory up (Makefile,
include/, src/); an sdist made by build_sdist carries them under ``csrc/``.
The library is built into a temporary directory, never into the checkout's
build/, so a ``DEBUG=1`` or ``NATIVE=1`` build there is neither used nor
clobbered. Extra make arguments: ``FLASHATTN_MAKE_ARGS="NO_OMP=1 CC=clang"``
in the environment, or ``--config-settings make-args="..."``.

``pip install -e ./python`` (build_editable) instead builds the checkout's
build/libflashattn.so and puts this directory on sys.path with a .pth file, so
the checkout's flashattn.py is what is imported.

The wheel's tag is ``py3-none-<platform>``: the .so is native code for this
machine, but it is loaded by ctypes, so it does not depend on the Python ABI.
"""

import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
import tarfile
import tempfile
import zipfile

NAME = "flashattn"
HERE = os.path.dirname(os.path.abspath(__file__))


# ---- where things are --------------------------------------------------------

def _c_root():
    """The directory holding the Makefile, include/ and src/."""
    for root in (os.path.join(HERE, "csrc"), os.path.dirname(HERE)):
        if all(os.path.exists(os.path.join(root, p))
               for p in ("Makefile", os.path.join("include", "flashattn.h"), "src")):
            return root
    raise RuntimeError(f"flashattn: no C sources (Makefile, include/flashattn.h, src/) next to "
                       f"{HERE}; install from a checkout of the repository: pip install ./python")


def _version():
    with open(os.path.join(_c_root(), "include", "flashattn.h"), encoding="utf-8") as f:
        m = re.search(r'#define\s+FA_VERSION\s+"([0-9][0-9A-Za-z.+-]*)"', f.read())
    if not m:
        raise RuntimeError("flashattn: FA_VERSION not found in include/flashattn.h")
    return m.group(1)


def _platform_tag():
    return re.sub(r"[^A-Za-z0-9_]", "_", sysconfig.get_platform())


def _metadata(version):
    return ("Metadata-Version: 2.1\n"
            f"Name: {NAME}\n"
            f"Version: {version}\n"
            "Summary: Exact attention on CPUs computed the FlashAttention way "
            "(ctypes binding of libflashattn)\n"
            "Requires-Python: >=3.8\n"
            "Requires-Dist: numpy\n")


def _wheel_file():
    return ("Wheel-Version: 1.0\n"
            "Generator: flashattn_build_backend\n"
            "Root-Is-Purelib: false\n"
            f"Tag: py3-none-{_platform_tag()}\n")


# ---- building the library ------------------------------------------------------

def _make_args(config_settings):
    args = shlex.split(os.environ.get("FLASHATTN_MAKE_ARGS", ""))
    if config_settings and config_settings.get("make-args"):
        args += shlex.split(config_settings["make-args"])
    return args


def _build_library(build_dir, config_settings):
    """Run the project's Makefile; return the path of the shared library.
    build_dir: a temporary directory, or the checkout's build/ (editable)."""
    make = os.environ.get("MAKE", "make")
    if shutil.which(make) is None:
        raise RuntimeError(f"flashattn: '{make}' not found; building libflashattn.so needs make "
                           "and a C11 compiler (apt-get install build-essential)")
    target = os.path.join(build_dir, "libflashattn.so")
    jobs = str(max(1, min(os.cpu_count() or 1, 16)))
    cmd = [make, "-C", _c_root(), f"-j{jobs}", f"BUILD={build_dir}"] + \
        _make_args(config_settings) + [target]
    # Only FLASHATTN_MAKE_ARGS reaches make: an outer make's MAKEFLAGS (jobserver
    # descriptors pip does not pass on, variables of another build) is dropped.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    print("flashattn: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    r = subprocess.run(cmd, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"flashattn: building libflashattn.so failed (make exited "
                           f"{r.returncode}); the compiler's messages are above")
    # A versioned build may make libflashattn.so a symlink: ship the real file.
    return os.path.realpath(target)


# ---- the wheel ---------------------------------------------------------------

def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _write_wheel(path, files):
    """files: [(arcname, bytes, mode)]; RECORD is added last, as PEP 427 asks."""
    dist_info = next(a.split("/")[0] for a, _, _ in files if a.endswith(".dist-info/METADATA"))
    record = [_record_line(a, d) for a, d, _ in files] + [f"{dist_info}/RECORD,,"]
    files = files + [(f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644)]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for arcname, data, mode in files:
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)


def _dist_info_files(version):
    di = f"{NAME}-{version}.dist-info"
    return [(f"{di}/METADATA", _metadata(version).encode(), 0o644),
            (f"{di}/WHEEL", _wheel_file().encode(), 0o644),
            (f"{di}/top_level.txt", f"{NAME}\n".encode(), 0o644)]


def _wheel_name(version):
    return f"{NAME}-{version}-py3-none-{_platform_tag()}.whl"


# ---- PEP 517 hooks -------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    version = _version()
    di = os.path.join(metadata_directory, f"{NAME}-{version}.dist-info")
    os.makedirs(di, exist_ok=True)
    for arcname, data, _ in _dist_info_files(version):
        with open(os.path.join(metadata_directory, arcname), "wb") as f:
            f.write(data)
    return os.path.basename(di)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """pip install -e ./python: the checkout's python/flashattn.py is imported
    in place (a .pth file puts this directory on sys.path), and it loads the
    checkout's build/libflashattn.so, which this hook builds with `make`."""
    if os.path.join(HERE, "csrc") == _c_root():
        raise RuntimeError("flashattn: an editable install needs a checkout, not an sdist")
    version = _version()
    _build_library(os.path.join(_c_root(), "build"), config_settings)
    files = [(f"__editable__.{NAME}.pth", (HERE + "\n").encode(), 0o644)] + \
        _dist_info_files(version)
    name = _wheel_name(version)
    _write_wheel(os.path.join(wheel_directory, name), files)
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    with open(os.path.join(HERE, "flashattn.py"), "rb") as f:
        module = f.read()
    build_dir = tempfile.mkdtemp(prefix="flashattn-build-")
    try:
        with open(_build_library(build_dir, config_settings), "rb") as f:
            lib = f.read()
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    files = [(f"{NAME}/__init__.py", module, 0o644),
             (f"{NAME}/libflashattn.so", lib, 0o755)] + _dist_info_files(version)
    name = _wheel_name(version)
    _write_wheel(os.path.join(wheel_directory, name), files)
    return name


def build_sdist(sdist_directory, config_settings=None):
    """A source archive that builds without the checkout: the Python side at
    its top, the Makefile, mk/, include/ and src/ under csrc/."""
    version = _version()
    root = _c_root()
    base = f"{NAME}-{version}"
    members = [(os.path.join(HERE, p), p) for p in
               ("pyproject.toml", "flashattn_build_backend.py", "flashattn.py")]
    members.append((os.path.join(root, "Makefile"), "csrc/Makefile"))
    for sub in ("include", "src", "mk"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, sub)):
            dirnames.sort()
            for fn in sorted(filenames):
                if fn.endswith((".c", ".h", ".mk")):
                    full = os.path.join(dirpath, fn)
                    members.append((full, "csrc/" + os.path.relpath(full, root)))
    name = base + ".tar.gz"
    pkg_info = _metadata(version).encode()
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for full, arc in members:
            t.add(full, arcname=f"{base}/{arc}", recursive=False)
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        info.mode = 0o644
        t.addfile(info, io.BytesIO(pkg_info))
    return name
