#!/bin/sh
# tools/ompi_debs.sh — carry Open MPI to a machine without a network (the GPU host's CPUs).
#
#   sh tools/ompi_debs.sh download [DIR]   here (with apt): the runtime .deb files of Debian 12's
#                                          Open MPI 4.1 (openmpi-bin, libopenmpi3 and what they
#                                          load) into DIR (default build/ompi-debs, ignored by git)
#   sh tools/ompi_debs.sh install [DIR]    there (as root): dpkg -i the ones not installed yet
#                                          (a package already present, at any version, is left
#                                          alone), then check that mpirun runs
#
# The MPI binaries themselves are built here (make mpi) and carried with the .debs:
# build/flashattn-mpi links libflashattn statically and Open MPI dynamically.
set -eu
cmd=${1:-}
dir=${2:-build/ompi-debs}
pkgs="openmpi-bin openmpi-common libopenmpi3 libhwloc15 libhwloc-plugins libevent-core-2.1-7
      libevent-pthreads-2.1-7 libevent-2.1-7 libpmix2 libfabric1 libucx0 libibverbs1 ibverbs-providers
      librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200 libmunge2 libxnvctrl0
      ocl-icd-libopencl1 libnuma1 libgomp1"
case $cmd in
download)
    mkdir -p "$dir"
    (cd "$dir" && apt-get download $pkgs)
    echo "ompi_debs: $(ls "$dir"/*.deb | wc -l) files, $(du -sh "$dir" | cut -f1) in $dir"
    ;;
install)
    [ "$(id -u)" = 0 ] || { echo "ompi_debs: install needs root (dpkg -i)" >&2; exit 2; }
    ls "$dir"/*.deb >/dev/null 2>&1 || { echo "ompi_debs: no .deb files in $dir" >&2; exit 2; }
    todo=""
    for f in "$dir"/*.deb; do
        p=$(dpkg-deb -f "$f" Package)
        if dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
            echo "ompi_debs: $p already installed ($(dpkg-query -W -f '${Version}' "$p")), kept"
        else
            todo="$todo $f"
        fi
    done
    [ -n "$todo" ] && dpkg -i $todo
    mpirun --version | head -1
    ;;
*)
    sed -n '2,13p' "$0"; exit 2 ;;
esac
