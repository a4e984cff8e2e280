# Sourced by tests/broker/ctl: the Debian root a RabbitMQ 4.x node runs
# from, on a machine whose own Debian ships 3.10.
#
# The root is made once with debootstrap (minbase) from the machine's own
# Debian mirror, gets rabbitmq-server and erlang-dev (erlc, for the
# stand-in) from its suite, and is kept outside the work tree, so every
# checkout and every later start shares it. The node shares the machine's
# network (and its epmd); its data lives under the checkout's
# target/test-broker, which is bind-mounted into the root at the same path,
# so paths, pid files and logs read the same inside and out.
#
# Needs: ROOTFS, SUITE, BASE and die from ctl.

rootfs_ready() { [ -f "$ROOTFS/.redeliver-ready" ]; }

# The machine's Debian mirror (its first deb.debian.org-style main URI), so
# that a machine behind a local mirror uses it for the root too.
rootfs_mirror() {
    local uri
    [ -n "${REDELIVER_TEST_DEBIAN_MIRROR:-}" ] && { echo "$REDELIVER_TEST_DEBIAN_MIRROR"; return; }
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null \
        | grep -Eo 'https?://[^ ]+/debian/?( |$)' | grep -v security | sed -n 1p | tr -d ' ')
    echo "${uri:-http://deb.debian.org/debian}"
}

# Unmounts whatever is mounted under the root (before it is deleted: a
# bind-mounted work tree must never be deleted with it).
rootfs_unmount() {
    local m
    for m in $(awk -v r="$ROOTFS/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m" || die "could not unmount $m"
    done
}

# /proc for the node, and this checkout's target/test-broker at its own path.
rootfs_mount() {
    mountpoint -q "$ROOTFS/proc" || mount -t proc proc "$ROOTFS/proc" \
        || die "could not mount /proc in $ROOTFS (a 4.x node needs root: chroot and mount)"
    mkdir -p "$BASE" "$ROOTFS$BASE"
    # A mount of a target/test-broker deleted since (cargo clean, a new
    # clone at the same path) shows the old, deleted directory: remount.
    if mountpoint -q "$ROOTFS$BASE" \
        && [ "$(stat -c %d:%i "$BASE")" != "$(stat -c %d:%i "$ROOTFS$BASE")" ]; then
        umount "$ROOTFS$BASE" 2>/dev/null || umount -l "$ROOTFS$BASE" \
            || die "could not unmount the stale $ROOTFS$BASE"
    fi
    mountpoint -q "$ROOTFS$BASE" || mount --bind "$BASE" "$ROOTFS$BASE" \
        || die "could not bind-mount $BASE into $ROOTFS"
}

# Makes the root when it is missing or half made. One maker at a time.
rootfs_ensure() {
    rootfs_ready && { rootfs_mount; return 0; }
    [ "$(id -u)" = 0 ] || die "a RabbitMQ 4.x node runs from a Debian root made with debootstrap; run as root"
    mkdir -p "$(dirname "$ROOTFS")"
    exec 6>"$ROOTFS.lock"
    flock 6
    if ! rootfs_ready; then rootfs_make; fi
    exec 6>&-
    rootfs_mount
}

rootfs_make() {
    local log="$ROOTFS.make.log" mirror started
    started=$(date +%s)
    mirror=$(rootfs_mirror)
    echo "tests/broker/ctl: making the Debian $SUITE root for RabbitMQ 4.x in $ROOTFS from $mirror (once; log: $log)" >&2
    rootfs_unmount
    rm -rf "$ROOTFS"
    {
        command -v debootstrap >/dev/null || {
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
        }
        # Debian 12's debootstrap has no script for newer suites; theirs is
        # sid's.
        debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$mirror" /usr/share/debootstrap/scripts/sid
    } >"$log" 2>&1 </dev/null || { tail -n 20 "$log" >&2; die "debootstrap of $SUITE failed (see $log)"; }
    # No service may start inside the root on install; localhost must
    # resolve there, or the node (name @localhost) does not boot.
    printf '#!/bin/sh\nexit 101\n' >"$ROOTFS/usr/sbin/policy-rc.d"
    chmod 755 "$ROOTFS/usr/sbin/policy-rc.d"
    printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' >"$ROOTFS/etc/hosts"
    rootfs_mount
    chroot "$ROOTFS" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        rabbitmq-server erlang-dev >>"$log" 2>&1 </dev/null \
        || { tail -n 20 "$log" >&2; die "installing rabbitmq-server in the $SUITE root failed (see $log)"; }
    touch "$ROOTFS/.redeliver-ready"
    echo "tests/broker/ctl: the $SUITE root is ready ($(ls "$ROOTFS/usr/lib/rabbitmq/lib/"), $(($(date +%s) - started)) s)" >&2
}
