"""One controller per switch (mbalancer/ownership.py), with real processes and the kernel's locks."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from mbalancer.ownership import Ownership


def test_one_process_owns_a_switch_until_it_ends_however_it_ends(tmp_path):
    """The owner lock is the kernel's: a second owner is told who holds it; kill -9 frees it at once."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom pathlib import Path\nfrom mbalancer.ownership import Ownership\n"
        f"o = Ownership(['ebpf:sw1', 'ebpf:sw2'], '127.0.0.1:1', Path({str(tmp_path)!r}))\n"
        "assert o.take() is None\nprint('held', flush=True)\ntime.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        mine = Ownership(["ebpf:sw2"], "127.0.0.1:2", tmp_path)
        owner = mine.take()
        assert owner is not None and owner.pid == holder.pid and "ebpf:sw2 is driven by controller pid" in \
            owner.describe() and "http://127.0.0.1:1" in owner.describe()
        assert Ownership([], "127.0.0.1:3", tmp_path / "nowhere" / "at all").take() is None  # no switch: no lock
        assert Ownership.holder("ebpf:sw1", tmp_path).pid == holder.pid  # what `switch detach` warns about
        assert Ownership.holder("ebpf:other", tmp_path) is None
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert Ownership.holder("ebpf:sw1", tmp_path) is None  # its file is left, its lock is not
        give_up = threading.Event()
        threading.Timer(10, give_up.set).start()  # bounded: a lock that outlived its owner fails the test
        assert mine.wait_take(give_up) is None  # free the moment it died
        give_up.set()
        assert Ownership(["ebpf:sw2"], "127.0.0.1:4", tmp_path).take().pid == os.getpid()
        mine.release()
    finally:
        holder.kill()
        holder.wait()


def test_a_released_switch_leaves_no_owner_file_and_many_takers_never_share_it(tmp_path):
    """Files no longer pile up: release removes each switch's file (held, so no taker locks the removed one
    unnoticed). Two threads take and release the same switch 200 times each: never both at once."""
    first = Ownership(["ebpf:a", "ebpf:b"], "127.0.0.1:1", tmp_path)
    assert first.take() is None and sorted(p.name for p in tmp_path.iterdir()) == ["ebpf_a.lock", "ebpf_b.lock"]
    first.release()
    assert list(tmp_path.iterdir()) == []
    inside, overlaps = [0], []

    def contend() -> None:
        mine = Ownership(["ebpf:a"], "127.0.0.1:2", tmp_path)
        for _ in range(200):
            if mine.take() is None:
                inside[0] += 1
                overlaps.append(inside[0] > 1)
                inside[0] -= 1
                mine.release()

    threads = [threading.Thread(target=contend) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert overlaps and not any(overlaps)
    assert list(tmp_path.iterdir()) == []
