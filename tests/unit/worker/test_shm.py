from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest
from inferd.worker.wire import shm
from inferd.worker.wire.errors import ErrorCode, InferdError

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")


@pytest.fixture
def name():
    n = shm.make_name(os.getpid(), "t" + uuid.uuid4().hex[:12])
    yield n
    shm.unlink(n)


def _leftover(name: str, size: int = 16) -> None:
    """A plain file under /dev/shm, as a process killed between create and unlink leaves one."""
    with open("/dev/shm/" + name, "xb") as f:
        f.write(b"\0" * size)


def test_create_attach_roundtrip(name):
    region = shm.create(name, 4096)
    # the name is a handle to an unlinked file: nothing under /dev/shm, reachable through our fd
    assert region.name.startswith(name + ".") and shm.stem(region.name) == name
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(name)]
    fd, inode = map(int, region.name.rsplit(".", 2)[1:])
    st = os.stat("/proc/self/fd/%d" % fd)
    assert st.st_size == 4096 and st.st_ino == inode == region.inode and st.st_nlink == 0
    assert oct(st.st_mode & 0o777) == "0o600"
    region.buf[:5] = b"hello"
    other = shm.attach(region.name, readonly=True)
    assert bytes(other.buf[:5]) == b"hello" and other.readonly and other.inode == region.inode
    with pytest.raises(TypeError):
        other.buf[0] = 1
    rw = shm.attach(region.name)
    rw.buf[0:1] = b"J"
    assert bytes(region.buf[:5]) == b"Jello"
    for r in (region, other, rw):
        assert r.close() and r.closed
    assert region.close()  # idempotent


def test_create_is_exclusive_and_validates(name):
    a, b = shm.create(name, 10), shm.create(name, 10)  # the stem is free again at once: two regions
    assert a.name != b.name and a.inode != b.inode
    a.close()
    b.close()
    _leftover(name)
    with pytest.raises(FileExistsError):
        shm.create(name, 10)
    with pytest.raises(InferdError) as err:
        shm.create(name + "x", 0)
    assert err.value.code == ErrorCode.INVALID_ARG


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "../etc/passwd", "x y", "a\x00b", "é", "a" * 300])
def test_bad_names_refused(bad):
    for call in (lambda: shm.attach(bad), lambda: shm.create(bad, 10), lambda: shm.unlink(bad)):
        with pytest.raises(InferdError) as err:
            call()
        assert err.value.code == ErrorCode.INVALID_ARG
        assert bad not in err.value.message or bad == ""


def test_make_name_and_owner_pid():
    assert shm.make_name(123, "pool.7-a") == "inferd_123_pool.7-a"
    assert shm.owner_pid("inferd_123_pool") == 123
    assert shm.owner_pid("inferd_x_pool") is None and shm.owner_pid("other_1_x") is None
    with pytest.raises(InferdError):
        shm.make_name(1, "a/b")


def test_attach_missing_symlink_and_other_files(name, tmp_path):
    with pytest.raises(InferdError) as err:
        shm.attach(name)
    assert err.value.code == ErrorCode.NOT_FOUND and name not in err.value.message
    target = tmp_path / "target"
    target.write_bytes(b"x" * 100)
    os.symlink(str(target), "/dev/shm/" + name)
    with pytest.raises(InferdError) as err:
        shm.attach(name)
    assert err.value.code == ErrorCode.INVALID_ARG
    os.unlink("/dev/shm/" + name)
    os.mkfifo("/dev/shm/" + name) if hasattr(os, "mkfifo") else None
    if os.path.exists("/dev/shm/" + name):
        with pytest.raises(InferdError):
            shm.attach(name)
        os.unlink("/dev/shm/" + name)
    open("/dev/shm/" + name, "wb").close()  # empty file
    with pytest.raises(InferdError):
        shm.attach(name)


def test_close_with_live_views_defers_unmap(name):
    import numpy as np

    region = shm.create(name, 64)
    arr = np.frombuffer(region.buf, dtype=np.uint8)
    assert region.close() is False  # arr still views the mapping; GC unmaps later
    assert arr.sum() == 0
    del arr


def test_unlink(name):
    _leftover(name)
    assert shm.inode_of(name) == os.stat("/dev/shm/" + name).st_ino
    assert shm.unlink(name) is True
    assert shm.unlink(name) is False
    assert shm.inode_of(name) is None


def test_a_closed_region_cannot_be_attached_even_if_its_fd_is_reused(name):
    region = shm.create(name, 4096)
    handle, fd = region.name, int(region.name.rsplit(".", 2)[1])
    assert shm.inode_of(handle) == region.inode
    region.close()
    with pytest.raises(InferdError) as err:
        shm.attach(handle)
    assert err.value.code == ErrorCode.NOT_FOUND and shm.inode_of(handle) is None
    other = shm.create(name + "x", 4096)  # very likely takes the same fd number
    try:
        assert int(other.name.rsplit(".", 2)[1]) != fd or other.inode != region.inode
        with pytest.raises(InferdError) as err:
            shm.attach(handle)
        assert err.value.code == ErrorCode.NOT_FOUND and shm.inode_of(handle) is None
    finally:
        other.close()


def test_regions_vanish_with_their_creator_even_on_kill_9():
    code = textwrap.dedent("""
        import os, sys
        from inferd.worker.wire import shm
        r = shm.create(shm.make_name(os.getpid(), "k"), 1 << 20)
        r.buf[:2] = b"ok"
        print(r.name, flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        handle = proc.stdout.readline().strip()
        attached = shm.attach(handle, readonly=True)  # another process attaches by handle
        assert bytes(attached.buf[:2]) == b"ok"
        assert not [n for n in os.listdir("/dev/shm") if n.startswith("inferd_%d_" % proc.pid)]
        proc.kill()
        proc.wait()
        assert bytes(attached.buf[:2]) == b"ok"  # a mapping outlives its creator
        attached.close()
        with pytest.raises(InferdError) as err:
            shm.attach(handle)
        assert err.value.code == ErrorCode.NOT_FOUND
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_enospc_from_fallocate_is_tritons_pool_error(name, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(InferdError) as err:
        shm.create(name, 1 << 20)
    assert err.value.code == ErrorCode.INTERNAL  # as Triton's Python backend answers a pool that cannot grow
    assert err.value.message.startswith("shared memory exhausted") and name not in err.value.message
    assert "Failed to increase the shared memory pool size" in err.value.message
    assert not os.path.exists("/dev/shm/" + name)  # nothing left behind


def test_fallocate_unsupported_still_creates(name, monkeypatch):
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    shm.create(name, 4096).close()


def test_enospc_on_a_real_small_tmpfs():
    """A real full /dev/shm (private mount namespace, 1 MiB tmpfs): ENOSPC, not SIGBUS."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare")
    code = textwrap.dedent("""
        from inferd.worker.wire import shm
        from inferd.worker.wire.errors import InferdError
        r = shm.create(shm.make_name(1, "small"), 256 * 1024)
        r.buf[:] = b"x" * len(r.buf)
        try:
            shm.create(shm.make_name(1, "big"), 4 << 20)
        except InferdError as exc:
            print(exc.code.name, exc.message)
        import os
        print(sorted(os.listdir("/dev/shm")))
    """)
    script = "mount -t tmpfs -o size=1m tmpfs /dev/shm && exec %s -c '%s'" % (sys.executable, code)
    proc = subprocess.run([unshare, "-m", "sh", "-c", script], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0 and ("unshare" in proc.stderr or "mount" in proc.stderr):
        pytest.skip("cannot create a private tmpfs here: %s" % proc.stderr.strip()[:200])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("INTERNAL shared memory exhausted"), proc.stdout
    assert lines[1] == "[]"  # the region still holds its pages, unlinked


def _spawn_exited_child() -> int:
    """pid of a process that has exited and been reaped (dead)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_stale_dead_zombie_alive():
    prefix = "inferdtest%s_" % uuid.uuid4().hex[:8]
    dead_pid = _spawn_exited_child()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    # wait until it is a zombie, without reaping it
    for _ in range(500):
        with open("/proc/%d/stat" % zombie.pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        os.sched_yield()
        import time

        time.sleep(0.01)
    names = {
        "dead": "%s%d_a" % (prefix, dead_pid),
        "zombie": "%s%d_b" % (prefix, zombie.pid),
        "mine": "%s%d_c" % (prefix, os.getpid()),
        "parent": "%s%d_d" % (prefix, os.getppid()),
        "odd": "%sxyz_e" % prefix,
    }
    try:
        for n in names.values():
            _leftover(n)
        assert shm.pid_state(zombie.pid) == "zombie"
        removed = shm.sweep_stale(prefix)
        assert sorted(removed) == sorted([names["dead"], names["zombie"]])
        left = {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
        assert left == {names["mine"], names["parent"], names["odd"]}
    finally:
        zombie.wait()
        for n in names.values():
            shm.unlink(n)


def test_sweep_detects_pid_reuse():
    """A live pid that started after the segment was last written is not its owner any more."""
    prefix = "inferdtest%s_" % uuid.uuid4().hex[:8]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    old = "%s%d_old" % (prefix, child.pid)
    new = "%s%d_new" % (prefix, child.pid)
    try:
        _leftover(old)
        _leftover(new)
        then = os.path.getmtime("/dev/shm/" + old) - 3600
        os.utime("/dev/shm/" + old, (then, then))  # written an hour before its "owner" started
        assert shm.sweep_stale(prefix) == [old]
        assert os.path.exists("/dev/shm/" + new)
    finally:
        child.kill()
        child.wait()
        shm.unlink(old)
        shm.unlink(new)
