#!/usr/bin/env bash
# Builds Headwater's container images without a container registry:
#
#   headwater-base:bookworm      Debian bookworm (debootstrap --variant=minbase) with Python 3.11
#   headwater:latest             a node: deploy/Dockerfile on that base, installed from wheels
#                                built here beforehand (the image build downloads nothing)
#   headwater-prometheus:latest  Prometheus from Debian's package, run as its own user
#
# Run it as root (debootstrap and chroot need it), from any folder; it installs debootstrap
# when that is missing. Both Debian images grow from one minbase root filesystem, updated
# from bookworm-updates and bookworm-security, into which apt-get installs Python or
# Prometheus. The wheels are built while debootstrap runs, and the Prometheus image while
# the node image is.
#
# A second run reuses what the first built: the two Debian images while they exist, the
# wheels while pyproject.toml and the source are unchanged, and the node image's layers
# through Docker's cache, so it takes seconds. The working files are in deploy/.build/:
# the Debian packages downloaded (kept for the next debootstrap), the wheels, the logs.
#
# Environment:
#   DEBIAN_MIRROR           Debian mirror (default http://deb.debian.org/debian)
#   DEBIAN_SECURITY_MIRROR  mirror of the security updates applied to both Debian images
#                           (default http://deb.debian.org/debian-security; empty: none)
#   BASE_IMAGE              base of the node image instead of headwater-base:bookworm, e.g.
#                           python:3.11-slim-bookworm where a registry is reachable; its
#                           Python must be 3.11, which the wheels are built for
#   PYTHON                  the Python 3.11 whose pip builds the wheels (default: the
#                           project's .venv, else python3)
#   REBUILD=1               build everything again: both Debian images, the wheels, and
#                           the node image (without Docker's cache when BASE_IMAGE is set)
set -euo pipefail

DEPLOY_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
ROOT_DIR=$(dirname -- "$DEPLOY_DIR")
BUILD_DIR=$DEPLOY_DIR/.build
DEBS_DIR=$BUILD_DIR/debs        # every .deb downloaded: debootstrap's --cache-dir, and apt's
WHEELS_DIR=$BUILD_DIR/wheels    # deps/ and project/: what the Dockerfile installs
STATE_DIR=$BUILD_DIR/state      # what the wheels were built from, and this run's results
LOG_DIR=$BUILD_DIR/logs

SUITE=bookworm
PYTHON_VERSION=3.11             # bookworm's python3
BASE_TAG=headwater-base:$SUITE
NODE_TAG=headwater:latest
PROM_TAG=headwater-prometheus:latest
# Installed into the node image besides the project's own requirements (pyproject.toml's
# dependencies and `server` extra), whether or not pyproject.toml lists them yet.
EXTRA_REQUIREMENTS=(prometheus-client==0.26.0)

DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR-http://deb.debian.org/debian-security}
BASE_IMAGE=${BASE_IMAGE:-}
REBUILD=${REBUILD:-0}
IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

say() { printf '==> [%4ss] %s\n' "$SECONDS" "$*"; }
die() {
    printf 'build-images.sh: %s\n' "$*" >&2
    exit 1
}

# result ITEM TEXT: what this run did for ITEM, for the summary at the end (a file, since
# background jobs report too).
result() { printf '%s\n' "$2" >"$STATE_DIR/results/${1//[\/:]/_}"; }

# run_logged LOG COMMAND...: runs COMMAND with its output appended to LOG; shows the end of
# LOG when it fails.
run_logged() {
    local log=$1
    shift
    if ! "$@" >>"$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "failed: $* (the whole output is in $log)"
    fi
}

image_id() { docker image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }

# retire OLD_ID TAG: removes the image that TAG named before it was built again, unless
# something still uses it (a container, another tag).
retire() {
    local old=$1 tag=$2
    if [[ -n $old && $old != "$(image_id "$tag")" ]]; then
        docker rmi "$old" >/dev/null 2>&1 || true
    fi
}

# ----------------------------------------------------------------------- background jobs

declare -A JOBS=()

# start_job NAME FUNCTION: runs FUNCTION in the background; wait_job NAME stops the build
# if it failed.
start_job() {
    "$2" &
    JOBS[$1]=$!
}

wait_job() {
    local pid=${JOBS[$1]}
    unset "JOBS[$1]"
    wait "$pid" || die "$1 failed (its output is above and in $LOG_DIR)"
}

kill_tree() {
    local child children
    if command -v pgrep >/dev/null; then
        children=$(pgrep -P "$1" || true)
    else
        children=$(cat /proc/"$1"/task/*/children 2>/dev/null || true)
    fi
    for child in $children; do
        kill_tree "$child"
    done
    kill "$1" 2>/dev/null || true
}

# A build that stops early stops its background jobs too.
stop_jobs() {
    local name
    for name in "${!JOBS[@]}"; do
        kill_tree "${JOBS[$name]}"
    done
}

# ------------------------------------------------------------- Debian root filesystems

ensure_debootstrap() {
    command -v debootstrap >/dev/null && return
    command -v apt-get >/dev/null || die "debootstrap is missing and there is no apt-get to install it"
    say "installing debootstrap"
    local log=$LOG_DIR/apt-get-debootstrap.log
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap debian-archive-keyring \
        >>"$log" 2>&1; then
        run_logged "$log" env DEBIAN_FRONTEND=noninteractive sh -c \
            'apt-get update -q && apt-get install -y -q debootstrap debian-archive-keyring'
    fi
}

# link_debs FROM TO: hard-links into folder TO each .deb of folder FROM that TO lacks.
link_debs() {
    local deb
    for deb in "$1"/*.deb; do
        if [[ -f $deb && ! -e $2/${deb##*/} ]]; then
            ln "$deb" "$2/" 2>/dev/null || cp "$deb" "$2/" 2>/dev/null || true
        fi
    done
}

# chroot_apt DIR LOG ARGS...: `apt-get ARGS` in the root filesystem DIR. The packages come
# from DEBS_DIR when they are there, and what apt-get downloads is kept there.
chroot_apt() {
    local dir=$1 log=$2
    shift 2
    local apt=(chroot "$dir" /usr/bin/env DEBIAN_FRONTEND=noninteractive
        apt-get -y -q -o Dpkg::Options::=--force-confold)
    link_debs "$DEBS_DIR" "$dir/var/cache/apt/archives"
    run_logged "$log" "${apt[@]}" --download-only "$@"
    link_debs "$dir/var/cache/apt/archives" "$DEBS_DIR"
    run_logged "$log" "${apt[@]}" "$@"
}

# bootstrap_rootfs DIR: a minbase bookworm with ca-certificates in DIR, brought up to date
# from bookworm-updates and the security mirror, and configured as Debian's own container
# images are: no docs, man pages or translations (now or from later package installs), no
# apt caches left behind, and no services started by packages.
bootstrap_rootfs() {
    local dir=$1
    [[ $(id -u) == 0 ]] || die "debootstrap and chroot need root"
    ensure_debootstrap
    rm -rf "$dir"
    say "debootstrap --variant=minbase $SUITE from $DEBIAN_MIRROR"
    run_logged "$LOG_DIR/debootstrap.log" debootstrap --variant=minbase \
        --include=ca-certificates --cache-dir="$DEBS_DIR" "$SUITE" "$dir" "$DEBIAN_MIRROR"

    printf '#!/bin/sh\n# Packages installed in a container start no services.\nexit 101\n' \
        >"$dir/usr/sbin/policy-rc.d"
    chmod 755 "$dir/usr/sbin/policy-rc.d"
    cat >"$dir/etc/dpkg/dpkg.cfg.d/excludes" <<'EOF'
# Documentation, manual pages and translations are left out of this image, also by later
# package installs; the copyright files stay.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
    cat >"$dir/etc/apt/apt.conf.d/docker-clean" <<'EOF'
// Downloaded packages and apt's binary caches are deleted after each use, so that they do
// not end up in an image layer; recommended packages are not installed.
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
APT::Install-Recommends "false";
EOF
    {
        echo "deb $DEBIAN_MIRROR $SUITE main"
        echo "deb $DEBIAN_MIRROR $SUITE-updates main"
        if [[ -n $DEBIAN_SECURITY_MIRROR ]]; then
            echo "deb $DEBIAN_SECURITY_MIRROR $SUITE-security main"
        fi
    } >"$dir/etc/apt/sources.list"
    say "apt-get upgrade from $SUITE-updates${DEBIAN_SECURITY_MIRROR:+ and $SUITE-security}"
    run_logged "$LOG_DIR/apt-get-upgrade.log" chroot "$dir" /usr/bin/env \
        DEBIAN_FRONTEND=noninteractive apt-get update -q
    chroot_apt "$dir" "$LOG_DIR/apt-get-upgrade.log" upgrade
}

# copy_rootfs FROM DIR: DIR, a copy of the root filesystem FROM.
copy_rootfs() {
    rm -rf "$2"
    cp -a "$1" "$2"
}

# trim_rootfs DIR: deletes what an image does not need: package lists and caches, logs,
# the documentation and translations debootstrap installed, and the host's resolv.conf and
# hostname (Docker provides both).
trim_rootfs() {
    local dir=$1
    find "$dir/var/lib/apt/lists" "$dir/var/cache/apt" "$dir/var/log" -type f -delete
    rm -f "$dir"/var/cache/debconf/*-old "$dir"/var/lib/dpkg/*-old "$dir"/etc/*.dpkg-old
    find "$dir/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$dir"/usr/share/{man,info,groff,lintian,linda}/*
    find "$dir/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    rm -f "$dir/etc/resolv.conf" "$dir/etc/hostname"
}

# import_rootfs DIR TAG CHANGE...: the image TAG from DIR, with the Dockerfile instructions
# CHANGE...; then DIR is deleted.
import_rootfs() {
    local dir=$1 tag=$2 old change
    shift 2
    local changes=()
    for change in "$@"; do
        changes+=(--change "$change")
    done
    old=$(image_id "$tag")
    say "docker import $tag"
    tar --numeric-owner -C "$dir" --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
        -cf - . | docker import --message "debootstrap --variant=minbase $SUITE" \
        "${changes[@]}" - "$tag" >/dev/null
    retire "$old" "$tag"
    rm -rf "$dir"
}

build_base_image() {
    local dir=$BUILD_DIR/rootfs-base
    copy_rootfs "$BUILD_DIR/rootfs-minbase" "$dir"
    say "apt-get install python3 python3-venv (for $BASE_TAG)"
    chroot_apt "$dir" "$LOG_DIR/apt-get-base.log" install python3 python3-venv
    trim_rootfs "$dir"
    import_rootfs "$dir" "$BASE_TAG" \
        "ENV PATH=$IMAGE_PATH" \
        'ENV LANG=C.UTF-8' \
        'CMD ["/bin/bash"]'
    result "$BASE_TAG" "built ($(docker run --rm "$BASE_TAG" python3 --version))"
}

build_prometheus_image() {
    local dir=$BUILD_DIR/rootfs-prometheus ids
    copy_rootfs "$BUILD_DIR/rootfs-minbase" "$dir"
    # The web UI loads one file of moment-timezone (moment-timezone-with-data.min.js); its
    # data/ folder is 210 MB of the same time zones in other forms.
    echo 'path-exclude /usr/share/javascript/moment-timezone/data/*' \
        >>"$dir/etc/dpkg/dpkg.cfg.d/excludes"
    say "apt-get install prometheus (for $PROM_TAG)"
    chroot_apt "$dir" "$LOG_DIR/apt-get-prometheus.log" install prometheus
    trim_rootfs "$dir"
    # The package made the prometheus user; the TSDB goes to the /prometheus volume.
    ids=$(awk -F: '$1 == "prometheus" { print $3 ":" $4 }' "$dir/etc/passwd")
    [[ -n $ids ]] || die "the prometheus package made no prometheus user"
    install -d -m 0755 -o "${ids%:*}" -g "${ids#*:}" "$dir/prometheus"
    import_rootfs "$dir" "$PROM_TAG" \
        "ENV PATH=$IMAGE_PATH" \
        "USER $ids" \
        'WORKDIR /prometheus' \
        'VOLUME ["/prometheus"]' \
        'EXPOSE 9090' \
        'ENTRYPOINT ["/usr/bin/prometheus"]' \
        'CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", "--web.listen-address=0.0.0.0:9090"]'
    result "$PROM_TAG" "built ($(docker run --rm "$PROM_TAG" --version 2>&1 | head -n 1))"
}

# ------------------------------------------------------------------------------- wheels

# Sets PY: the interpreter whose pip builds the wheels. It must be the image's Python
# version, since the dependencies' wheels are binary (cp311, manylinux).
select_python() {
    if [[ -n ${PYTHON:-} ]]; then
        PY=$PYTHON
    elif [[ -x $ROOT_DIR/.venv/bin/python ]]; then
        PY=$ROOT_DIR/.venv/bin/python
    else
        PY=python3
    fi
    local version
    version=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
        || die "cannot run $PY (set PYTHON to a Python $PYTHON_VERSION)"
    [[ $version == "$PYTHON_VERSION" ]] \
        || die "$PY is Python $version; the wheels are for the image's Python $PYTHON_VERSION (set PYTHON)"
    if ! "$PY" -m pip --version >/dev/null 2>&1; then
        # A Python without pip (Debian's python3): a venv of its own for building the wheels.
        local venv=$BUILD_DIR/pip-venv
        if [[ ! -x $venv/bin/pip ]]; then
            say "creating $venv for pip"
            rm -rf "$venv"
            if ! "$PY" -m venv "$venv" >>"$LOG_DIR/pip-venv.log" 2>&1; then
                rm -rf "$venv"
                command -v apt-get >/dev/null || die "$PY has neither pip nor venv"
                run_logged "$LOG_DIR/pip-venv.log" \
                    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
                run_logged "$LOG_DIR/pip-venv.log" "$PY" -m venv "$venv"
            fi
        fi
        PY=$venv/bin/python
    fi
}

# The node's requirements, one per line: pyproject.toml's dependencies and `server` extra,
# then EXTRA_REQUIREMENTS not named there.
requirements() {
    "$PY" - "$ROOT_DIR/pyproject.toml" "${EXTRA_REQUIREMENTS[@]}" <<'EOF'
import re
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
reqs = project["dependencies"] + project.get("optional-dependencies", {}).get("server", [])


def name(req: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9._-]+)", req).group(1)).lower()


named = {name(r) for r in reqs}
reqs += [r for r in sys.argv[2:] if name(r) not in named]
print("\n".join(reqs))
EOF
}

# Wheels of every requirement and of their dependencies, in wheels/deps; built again only
# when the requirements change.
build_dependency_wheels() {
    local reqs want
    reqs=$(requirements)
    want=$(printf '%s\npython %s %s\n' "$reqs" "$PYTHON_VERSION" "$(uname -m)" | sha256sum | cut -d' ' -f1)
    if [[ $REBUILD != 1 && -f $STATE_DIR/deps.sha256 && $(<"$STATE_DIR/deps.sha256") == "$want" ]] \
        && compgen -G "$WHEELS_DIR/deps/*.whl" >/dev/null; then
        result wheels/deps reused
        return
    fi
    say "pip wheel: the dependencies ($(wc -l <<<"$reqs") requirements)"
    printf '%s\n' "$reqs" >"$STATE_DIR/requirements.txt"
    rm -rf "$WHEELS_DIR/deps.new"
    run_logged "$LOG_DIR/pip-wheel-deps.log" "$PY" -m pip wheel --disable-pip-version-check \
        --progress-bar off --wheel-dir "$WHEELS_DIR/deps.new" -r "$STATE_DIR/requirements.txt"
    rm -rf "$WHEELS_DIR/deps"
    mv "$WHEELS_DIR/deps.new" "$WHEELS_DIR/deps"
    echo "$want" >"$STATE_DIR/deps.sha256"
    result wheels/deps "built ($(find "$WHEELS_DIR/deps" -name '*.whl' | wc -l) wheels)"
}

# The project's files as a tar on stdout: those git tracks or would track (the working
# tree as it is, uncommitted changes included), without deploy/, tests/, docs/ and .ci/,
# in a fixed order with fixed owners and times, so that equal files make equal bytes.
source_snapshot() {
    if git -C "$ROOT_DIR" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git -C "$ROOT_DIR" ls-files -z --cached --others --exclude-standard -- \
            ':!:deploy' ':!:tests' ':!:docs' ':!:.ci' |
            while IFS= read -r -d '' f; do
                if [[ -e $ROOT_DIR/$f || -L $ROOT_DIR/$f ]]; then printf '%s\0' "$f"; fi
            done
    else
        (cd "$ROOT_DIR" && find . -mindepth 1 \( -path ./.git -o -path ./.venv -o -path ./deploy \
            -o -path ./tests -o -path ./docs -o -path ./.ci -o -path ./data -o -path ./build \
            -o -name .build -o -name __pycache__ -o -name '*.egg-info' -o -name '.*_cache' \) -prune \
            -o \( -type f -o -type l \) -print0)
    fi | tar -C "$ROOT_DIR" --null --no-recursion -T - --sort=name --mtime=@0 \
        --owner=0 --group=0 --numeric-owner -cf -
}

# The project's wheel in wheels/project, built from a copy of the source in .build/src
# (the build leaves nothing in the working tree); built again only when the source changes.
build_project_wheel() {
    local want
    source_snapshot >"$STATE_DIR/source.tar"
    want=$(sha256sum <"$STATE_DIR/source.tar" | cut -d' ' -f1)
    if [[ $REBUILD != 1 && -f $STATE_DIR/project.sha256 && $(<"$STATE_DIR/project.sha256") == "$want" ]] \
        && compgen -G "$WHEELS_DIR/project/*.whl" >/dev/null; then
        result wheels/project reused
        return
    fi
    say "pip wheel: the project"
    rm -rf "$BUILD_DIR/src" "$WHEELS_DIR/project.new"
    mkdir -p "$BUILD_DIR/src"
    tar -C "$BUILD_DIR/src" -xf "$STATE_DIR/source.tar"
    # SOURCE_DATE_EPOCH: the same source makes the same wheel, byte for byte, so Docker's
    # cache keeps the project's layer.
    run_logged "$LOG_DIR/pip-wheel-project.log" env SOURCE_DATE_EPOCH=315532800 \
        "$PY" -m pip wheel --disable-pip-version-check --progress-bar off --no-deps \
        --wheel-dir "$WHEELS_DIR/project.new" "$BUILD_DIR/src"
    rm -rf "$WHEELS_DIR/project" "$BUILD_DIR/src"
    mv "$WHEELS_DIR/project.new" "$WHEELS_DIR/project"
    echo "$want" >"$STATE_DIR/project.sha256"
    result wheels/project "built ($(cd "$WHEELS_DIR/project" && echo *.whl))"
}

build_wheels() {
    build_dependency_wheels
    build_project_wheel
}

# ---------------------------------------------------------------------------- node image

# Docker's legacy builder keeps an image of every step as its cache, and a new base image
# or new wheels leave the old ones behind: a few hundred MB each time. This removes the
# images that carry the node image's title label, are untagged, and are no step of the
# build just done, newest first (a child before its parent). Nothing in use is removed.
prune_build_cache() {
    local keep id tags short
    keep=" $(grep -oE '^ ---> [0-9a-f]{12}$' "$LOG_DIR/docker-build.log" | cut -c7- | tr '\n' ' ')"
    docker images -a -q --no-trunc --filter label=org.opencontainers.image.title=headwater |
        sort -u | xargs -r docker image inspect --format '{{.Created}} {{.Id}} {{len .RepoTags}}' |
        sort -r |
        while read -r _ id tags; do
            short=${id#sha256:}
            if [[ $tags == 0 && $keep != *" ${short:0:12} "* ]]; then
                docker rmi "$id" >/dev/null 2>&1 || true
            fi
        done
}

build_node_image() {
    local base=${BASE_IMAGE:-$BASE_TAG} old new
    local args=(--build-arg "BASE_IMAGE=$base" -f "$DEPLOY_DIR/Dockerfile" -t "$NODE_TAG")
    # A new debootstrapped base rebuilds every layer anyway; a registry's base may have
    # changed under the same name.
    if [[ $REBUILD == 1 && -n $BASE_IMAGE ]]; then
        args+=(--no-cache)
    fi
    # The context is .build; only the wheels go to the daemon.
    printf '%s\n' '*' '!wheels/deps/*.whl' '!wheels/project/*.whl' >"$BUILD_DIR/.dockerignore"
    old=$(image_id "$NODE_TAG")
    say "docker build $NODE_TAG on $base"
    run_logged "$LOG_DIR/docker-build.log" docker build "${args[@]}" "$BUILD_DIR"
    new=$(image_id "$NODE_TAG")
    if [[ $new == "$old" ]]; then
        result "$NODE_TAG" "reused (no change)"
        return
    fi
    retire "$old" "$NODE_TAG"
    prune_build_cache
    local version
    version=$(docker run --rm --entrypoint headwater "$NODE_TAG" --version) \
        || die "$NODE_TAG was built, but \`headwater --version\` fails in it"
    result "$NODE_TAG" "built ($version)"
}

# ---------------------------------------------------------------------------------- main

docker info >/dev/null 2>&1 || die "cannot reach the Docker daemon"
mkdir -p "$BUILD_DIR" "$DEBS_DIR" "$WHEELS_DIR" "$STATE_DIR" "$LOG_DIR"
exec 9>"$BUILD_DIR/lock"
flock -n 9 || die "another build-images.sh is running on $BUILD_DIR"
trap stop_jobs EXIT
trap 'exit 130' INT TERM
find "$LOG_DIR" -mindepth 1 -delete
rm -rf "$STATE_DIR/results"
mkdir -p "$STATE_DIR/results"

need_base=0
need_prom=0
old_base=$(image_id "$BASE_TAG")
if [[ -n $BASE_IMAGE ]]; then
    result "$BASE_TAG" "not used (BASE_IMAGE=$BASE_IMAGE)"
elif [[ $REBUILD == 1 || -z $(image_id "$BASE_TAG") ]]; then
    need_base=1
else
    result "$BASE_TAG" reused
fi
if [[ $REBUILD == 1 || -z $(image_id "$PROM_TAG") ]]; then
    need_prom=1
else
    result "$PROM_TAG" reused
fi

say "building in $BUILD_DIR$([[ $REBUILD == 1 ]] && echo ' (REBUILD=1: everything again)')"
select_python
start_job wheels build_wheels
if ((need_base || need_prom)); then
    bootstrap_rootfs "$BUILD_DIR/rootfs-minbase"
    if ((need_prom)); then
        start_job prometheus build_prometheus_image
    fi
    if ((need_base)); then
        build_base_image
    fi
fi
wait_job wheels
build_node_image
if ((need_prom)); then
    wait_job prometheus
fi
rm -rf "$BUILD_DIR/rootfs-minbase"
# The base image built before, once nothing is built on it any more.
retire "$old_base" "$BASE_TAG"

say "done in ${SECONDS}s"
for item in wheels/deps wheels/project "$BASE_TAG" "$NODE_TAG" "$PROM_TAG"; do
    size=
    if [[ $item != wheels/* && -n $(image_id "$item") ]]; then
        size=$(docker image inspect --format '{{.Size}}' "$item" | numfmt --to=si --suffix=B)
    fi
    printf '  %-28s %-7s %s\n' "$item" "$size" "$(cat "$STATE_DIR/results/${item//[\/:]/_}" 2>/dev/null)"
done
