"""Allocator settings (tokenmill.memory): applied on glibc, left alone when the user tuned malloc."""

import os
import platform

import pytest

from tokenmill import memory


def test_user_malloc_tuning_is_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "0")
    assert memory.limit_heap_retention() is False
    monkeypatch.delenv("MALLOC_MMAP_MAX_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=65536")
    assert memory.limit_heap_retention() is False
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("TOKENMILL_MALLOC_DEFAULTS", "1")
    assert memory.limit_heap_retention() is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")
def test_thresholds_are_fixed_on_glibc(monkeypatch):
    for k in [k for k in os.environ if k.startswith("MALLOC_")]:
        monkeypatch.delenv(k)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("TOKENMILL_MALLOC_DEFAULTS", raising=False)
    assert memory.limit_heap_retention() is True


def test_arrow_pool_respects_the_users_choice(monkeypatch):
    import pyarrow as pa

    try:
        other = pa.mimalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow has no mimalloc pool")
    pa.set_memory_pool(other)
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "mimalloc")
    memory.use_system_arrow_pool()
    assert pa.default_memory_pool().backend_name == "mimalloc"
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL")
    memory.use_system_arrow_pool()
    assert pa.default_memory_pool().backend_name == "system"


def test_processes_started_afterwards_use_the_system_pool_from_their_first_allocation(monkeypatch):
    import subprocess
    import sys

    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    memory.use_system_arrow_pool()
    # A local Beam worker: Arrow's default pool is chosen at its first use, before tokenmill's code runs.
    out = subprocess.run([sys.executable, "-c", "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "system"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_give_back_returns_freed_pages_that_a_live_block_pins():
    """Blocks freed below a live one stay resident (the heap cannot shrink past it) until
    give_back: the finish phase's encode batches leave such holes between batches."""
    import threading

    def rss_mb():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

    result = {}

    def work():  # in a thread of its own, like a Beam bundle: its own malloc arena
        blocks = [bytes(2000) for _ in range(60_000)]  # ~120 MB of heap blocks (above pymalloc's 512)
        pin = bytes(2000)
        del blocks
        before = rss_mb()
        memory.give_back()
        result["freed"] = before - rss_mb()
        del pin

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert result["freed"] > 50


def test_give_back_keeps_within_its_share_of_the_time(monkeypatch):
    """After a call that took t seconds the next waits t / share: a costly trim (a big,
    fragmented heap) comes rarely, a cheap one as often as asked."""
    calls = []
    monkeypatch.setattr(memory, "give_back", lambda: calls.append(now[0]))
    now = [100.0]

    def clock():
        return now[0]

    gb = memory.GiveBack(share=0.05, clock=clock)
    assert gb()  # the first call always gives back
    # It took no time on this clock: the next is due at once.
    assert gb()
    # A call that takes 0.03 s: the next is due 0.6 s after it ended.
    monkeypatch.setattr(memory, "give_back", lambda: (calls.append(now[0]), now.__setitem__(0, now[0] + 0.03)))
    assert gb()
    ended = now[0]
    now[0] = ended + 0.59
    assert not gb()
    now[0] = ended + 0.61
    assert gb()
    assert len(calls) == 4
