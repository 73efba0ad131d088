#!/bin/sh
# tests/test_python_install.sh — `pip install ./python` as a user runs it, offline.
#
# In a fresh venv (--system-site-packages, so numpy is there) and with pip
# told to use no index at all (so nothing can come from the network):
#   1. pip install --no-build-isolation ./python   (the README's offline command)
#      then, from /tmp with no path into the checkout, `import flashattn` must
#      load the .so from inside the installed package, a forward pass must match
#      a float64 numpy model, check() must pass it and fail a perturbed copy;
#      pip uninstall must remove the package and its .so;
#   2. pip install -e ./python imports the checkout's python/flashattn.py and
#      loads the checkout's build/libflashattn.so (built by the hook);
#   3. an sdist made by the backend, unpacked away from the checkout, installs
#      with build isolation (the default): the isolated build needs no network.
# Skipped with one line where python3 has no usable venv/pip or no numpy.
set -u
name=test_python_install
skip() { echo "$name: SKIP ($1)"; exit 0; }
fail() { echo "$name: FAIL: $1" >&2; exit 1; }

# Offline and clean: no index, no user config, nothing from the checkout on the path.
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CONFIG_FILE=/dev/null
unset FA_BUILD FLASHATTN_LIB PYTHONPATH PIP_FIND_LINKS
command -v python3 >/dev/null 2>&1 || skip "no python3"
python3 -c "import numpy" 2>/dev/null || skip "python3 has no numpy"
root=$(pwd)
tmp=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
python3 -m venv --system-site-packages "$tmp/venv" >"$tmp/venv.log" 2>&1 ||
    skip "python3 -m venv does not work here (apt-get install python3-venv)"
py=$tmp/venv/bin/python
"$py" -m pip --version >/dev/null 2>&1 || skip "the venv has no pip"
"$py" -c "import numpy" 2>/dev/null && "$py" -m pip show -q numpy >/dev/null 2>&1 ||
    skip "numpy is not installed where a --system-site-packages venv's pip sees it"

smoke() {  # $1: what was installed; runs from $tmp/run, outside the checkout
    mkdir -p "$tmp/run"
    (cd "$tmp/run" && "$py" - "$root" "$tmp/venv") <<'EOF' || fail "$1: the installed module does not work"
import os, sys
root, venv = (os.path.realpath(p) for p in sys.argv[1:3])
sys.path = [p for p in sys.path if not os.path.realpath(p or ".").startswith(root)]
import numpy as np
import flashattn as fa
pkg = os.path.realpath(os.path.dirname(fa.__file__))
lib = os.path.realpath(fa._find_library())
assert pkg.startswith(venv), f"flashattn imported from {pkg}, not from the venv"
assert os.path.dirname(lib) == pkg, f"library {lib} is not inside the package {pkg}"
assert not lib.startswith(root), lib
rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
q = rng.standard_normal((2, 17, 4, 32)).astype(np.float32)
k = rng.standard_normal((2, 29, 2, 32)).astype(np.float32)
v = rng.standard_normal((2, 29, 2, 16)).astype(np.float32)
o, lse = fa.attention(q, k, v, causal=True, return_lse=True)
kr, vr = np.repeat(k, 2, axis=2).astype(np.float64), np.repeat(v, 2, axis=2).astype(np.float64)
s = np.einsum("bihd,bjhd->bhij", q.astype(np.float64), kr) / np.sqrt(32)
s = np.where(np.arange(29)[None, :] <= np.arange(17)[:, None] + 12, s, -np.inf)
m = s.max(-1, keepdims=True)
p = np.exp(s - m)
want = np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), vr)
assert np.abs(o - want).max() < 1e-4, np.abs(o - want).max()
assert np.abs(lse - (m[..., 0] + np.log(p.sum(-1)))).max() < 1e-4
rep = fa.check(q, k, v, o, lse, causal=True)
assert rep.passed, rep.text
o[1, 3, 2, 5] += 0.01
assert not fa.check(q, k, v, o, causal=True).passed
print(f"flashattn {fa.__file__}: forward matches the model, check passes it and fails a perturbed copy")
EOF
}

echo "$name: pip install --no-build-isolation ./python (no index)"
"$py" -m pip install -q --no-build-isolation ./python >"$tmp/pip1.log" 2>&1 ||
    { cat "$tmp/pip1.log" >&2; fail "pip install --no-build-isolation ./python failed"; }
smoke "--no-build-isolation install"
so=$("$py" -c "import flashattn; print(flashattn._find_library())" 2>/dev/null) || fail "import after install"
"$py" -m pip uninstall -q -y flashattn >/dev/null 2>&1 || fail "pip uninstall flashattn failed"
[ ! -e "$so" ] || fail "pip uninstall left $so behind"
(cd "$tmp" && "$py" -c "import flashattn" 2>/dev/null) && fail "flashattn still importable after uninstall"

echo "$name: pip install -e ./python (editable: the checkout's module and build/ library)"
"$py" -m pip install -q --no-build-isolation -e ./python >"$tmp/pip3.log" 2>&1 ||
    { cat "$tmp/pip3.log" >&2; fail "pip install -e ./python failed"; }
(cd "$tmp" && "$py" -c "
import os, sys, flashattn as fa
root = os.path.realpath(sys.argv[1])
assert os.path.realpath(fa.__file__) == os.path.join(root, 'python', 'flashattn.py'), fa.__file__
assert os.path.realpath(fa._find_library()) == os.path.join(root, 'build', 'libflashattn.so')
fa.library()
" "$root") || fail "the editable install does not import the checkout's module and library"
"$py" -m pip uninstall -q -y flashattn >/dev/null 2>&1 || fail "pip uninstall of the editable install failed"
(cd "$tmp" && "$py" -c "import flashattn" 2>/dev/null) && fail "flashattn importable after uninstalling the editable install"

echo "$name: sdist from the backend, installed with build isolation (no index)"
(cd python && "$py" -c "import sys, flashattn_build_backend as b; print(b.build_sdist(sys.argv[1]))" \
    "$tmp") >"$tmp/sdist.name" 2>"$tmp/sdist.log" || { cat "$tmp/sdist.log" >&2; fail "build_sdist failed"; }
mkdir -p "$tmp/src" && tar -xzf "$tmp/$(cat "$tmp/sdist.name")" -C "$tmp/src" || fail "sdist does not unpack"
"$py" -m pip install -q "$tmp"/src/flashattn-* >"$tmp/pip2.log" 2>&1 ||
    { cat "$tmp/pip2.log" >&2; fail "pip install of the unpacked sdist (isolated build) failed"; }
smoke "isolated install from the sdist"
echo "$name: PASS"
