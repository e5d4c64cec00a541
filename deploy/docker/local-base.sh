#!/usr/bin/env bash
# Make a local stand-in for python:<version>-slim-bookworm where no image registry is reachable
# (Debian's debootstrap + podman), so deploy/docker/Dockerfile can be built and run offline from
# registries: tests/packaging/test_image.py. Needs root, podman and debootstrap (apt-get install podman
# debootstrap); downloads about 60 MB of Debian packages. Usage: deploy/docker/local-base.sh [workdir]
#
# The stand-in is Debian's python3 (3.11) with pip, tagged localhost/python:3.11.11-slim-bookworm: the
# commands the Dockerfile uses (python, pip) behave as in the official image; it is not that image.
set -euo pipefail
TAG=${INFERD_BASE_TAG:-localhost/python:3.11.11-slim-bookworm}
WORK=${1:-$(mktemp -d)}
ROOTFS=$WORK/rootfs
if [ ! -x "$ROOTFS/usr/bin/python3" ]; then
    debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates,passwd \
        bookworm "$ROOTFS" http://deb.debian.org/debian
fi
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
# trust what the host trusts (hosts behind a TLS-inspecting proxy reach PyPI only with their own CA)
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
tar -C "$ROOTFS" -c . | podman import \
    --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
    - "$TAG"
echo "base image: $TAG"
