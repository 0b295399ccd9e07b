"""CPython's own semaphore tests (Lib/test/test_asyncio/test_locks.py of 3.13: SemaphoreTests
and the Semaphore / BoundedSemaphore parts of LockTests), run against MeteredSemaphore.

Adapted only where they cannot apply as written, each marked "adapted":
- a private attribute is read: `_value` is `available`, `len(_waiters)` is `queue_depth` (a
  task handed its slot is no longer waiting, where `_waiters` lists it until it resumes), and
  test_repr makes real waiters instead of appending mocks to `_waiters`;
- the class name is in a message;
- `Semaphore(0)` followed by k releases of slots nobody took: MeteredSemaphore is bounded (as
  BoundedSemaphore, a release with no slot held is a ValueError), so the test starts with k
  slots held by itself (`held(k)`), which is the same state: no slot free, k to be released.
"""

# Kept in CPython's unittest form, so that it reads line by line against the original.
# ruff: noqa: PT009, PT027, SIM117

from __future__ import annotations

import asyncio
import re
import unittest

from gym_concurrency import MeteredSemaphore

STR_RGX_REPR = (
    r"^<(?P<class>.*?) object at (?P<address>.*?)"
    r"\[(?P<extras>"
    r"(set|unset|locked|unlocked|filling|draining|resetting|broken)"
    r"(, value:\d)?"
    r"(, waiters:\d+)?"
    r"(, waiters:\d+\/\d+)?"  # barrier
    r")\]>\Z"
)
RGX_REPR = re.compile(STR_RGX_REPR)


def held(slots: int) -> MeteredSemaphore:
    """adapted: for `Semaphore(0)` and `slots` releases, a bounded semaphore with that many
    slots, all taken by the test."""
    sem = MeteredSemaphore(slots)
    for _ in range(slots):
        assert sem.try_acquire()
    return sem


class LockTests(unittest.IsolatedAsyncioTestCase):
    async def test_lock_doesnt_accept_loop_parameter(self) -> None:
        loop = asyncio.get_running_loop()
        with self.assertRaisesRegex(
            TypeError,
            r"MeteredSemaphore\.__init__\(\) got an unexpected keyword argument 'loop'",
        ):
            MeteredSemaphore(loop=loop)  # type: ignore[call-arg]

    async def test_lock_by_with_statement(self) -> None:
        lock = MeteredSemaphore()
        await asyncio.sleep(0.01)
        self.assertFalse(lock.locked())
        with self.assertRaisesRegex(TypeError, r"object \w+ can't be used in 'await' expression"):
            with await lock:  # type: ignore[misc]
                pass
        self.assertFalse(lock.locked())


class SemaphoreTests(unittest.IsolatedAsyncioTestCase):
    def test_initial_value_zero(self) -> None:
        sem = MeteredSemaphore(0)
        self.assertTrue(sem.locked())

    async def test_repr(self) -> None:
        sem = MeteredSemaphore()
        self.assertTrue(repr(sem).endswith("[unlocked, value:1]>"))
        self.assertTrue(RGX_REPR.match(repr(sem)))

        await sem.acquire()
        self.assertTrue(repr(sem).endswith("[locked]>"))
        self.assertTrue("waiters" not in repr(sem))
        self.assertTrue(RGX_REPR.match(repr(sem)))

        # adapted: real waiters, not mocks appended to sem._waiters
        first = asyncio.create_task(sem.acquire())
        await asyncio.sleep(0)
        self.assertTrue("waiters:1" in repr(sem))
        self.assertTrue(RGX_REPR.match(repr(sem)))

        second = asyncio.create_task(sem.acquire())
        await asyncio.sleep(0)
        self.assertTrue("waiters:2" in repr(sem))
        self.assertTrue(RGX_REPR.match(repr(sem)))

        first.cancel()
        second.cancel()
        await asyncio.gather(first, second, return_exceptions=True)

    async def test_semaphore(self) -> None:
        sem = MeteredSemaphore()
        self.assertEqual(1, sem.available)  # adapted: sem._value

        with self.assertRaisesRegex(
            TypeError,
            "object MeteredSemaphore can't be used in 'await' expression",  # adapted: the name
        ):
            await sem  # type: ignore[misc]

        self.assertFalse(sem.locked())
        self.assertEqual(1, sem.available)  # adapted: sem._value

    def test_semaphore_value(self) -> None:
        self.assertRaises(ValueError, MeteredSemaphore, -1)

    async def test_acquire(self) -> None:
        sem = MeteredSemaphore(3)
        result = []

        self.assertTrue(await sem.acquire())
        self.assertTrue(await sem.acquire())
        self.assertFalse(sem.locked())

        async def c1(result: list[int]) -> bool:
            await sem.acquire()
            result.append(1)
            return True

        async def c2(result: list[int]) -> bool:
            await sem.acquire()
            result.append(2)
            return True

        async def c3(result: list[int]) -> bool:
            await sem.acquire()
            result.append(3)
            return True

        async def c4(result: list[int]) -> bool:
            await sem.acquire()
            result.append(4)
            return True

        t1 = asyncio.create_task(c1(result))
        t2 = asyncio.create_task(c2(result))
        t3 = asyncio.create_task(c3(result))

        await asyncio.sleep(0)
        self.assertEqual([1], result)
        self.assertTrue(sem.locked())
        self.assertEqual(2, sem.queue_depth)  # adapted: len(sem._waiters)
        self.assertEqual(0, sem.available)  # adapted: sem._value

        t4 = asyncio.create_task(c4(result))

        sem.release()
        sem.release()
        self.assertEqual(0, sem.available)  # adapted: sem._value

        await asyncio.sleep(0)
        self.assertEqual(0, sem.available)  # adapted: sem._value
        self.assertEqual(3, len(result))
        self.assertTrue(sem.locked())
        self.assertEqual(1, sem.queue_depth)  # adapted: len(sem._waiters)
        self.assertEqual(0, sem.available)  # adapted: sem._value

        self.assertTrue(t1.done())
        self.assertTrue(t1.result())
        race_tasks = [t2, t3, t4]
        done_tasks = [t for t in race_tasks if t.done() and t.result()]
        self.assertEqual(2, len(done_tasks))

        # cleanup locked semaphore
        sem.release()
        await asyncio.gather(*race_tasks)

    async def test_acquire_cancel(self) -> None:
        sem = MeteredSemaphore()
        await sem.acquire()

        acquire = asyncio.create_task(sem.acquire())
        asyncio.get_running_loop().call_soon(acquire.cancel)
        with self.assertRaises(asyncio.CancelledError):
            await acquire
        self.assertEqual(0, sem.queue_depth)  # adapted: all(w.done() for w in sem._waiters)

    async def test_acquire_cancel_before_awoken(self) -> None:
        sem = held(1)  # adapted: Semaphore(value=0), released once

        t1 = asyncio.create_task(sem.acquire())
        t2 = asyncio.create_task(sem.acquire())
        t3 = asyncio.create_task(sem.acquire())
        t4 = asyncio.create_task(sem.acquire())

        await asyncio.sleep(0)

        t1.cancel()
        t2.cancel()
        sem.release()

        await asyncio.sleep(0)
        await asyncio.sleep(0)
        num_done = sum(t.done() for t in [t3, t4])
        self.assertEqual(num_done, 1)
        self.assertTrue(t3.done())
        self.assertFalse(t4.done())

        t3.cancel()
        t4.cancel()
        await asyncio.sleep(0)

    async def test_acquire_hang(self) -> None:
        sem = held(1)  # adapted: Semaphore(value=0), released once

        t1 = asyncio.create_task(sem.acquire())
        t2 = asyncio.create_task(sem.acquire())
        await asyncio.sleep(0)

        t1.cancel()
        sem.release()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.assertTrue(sem.locked())
        self.assertTrue(t2.done())

    async def test_acquire_no_hang(self) -> None:
        sem = MeteredSemaphore(1)

        async def c1() -> None:
            async with sem:
                await asyncio.sleep(0)
            t2.cancel()

        async def c2() -> None:
            async with sem:
                self.assertFalse(True)

        t1 = asyncio.create_task(c1())
        t2 = asyncio.create_task(c2())

        r1, r2 = await asyncio.gather(t1, t2, return_exceptions=True)
        self.assertTrue(r1 is None)
        self.assertTrue(isinstance(r2, asyncio.CancelledError))

        await asyncio.wait_for(sem.acquire(), timeout=1.0)

    def test_release_not_acquired(self) -> None:
        sem = MeteredSemaphore()  # asyncio.BoundedSemaphore()

        self.assertRaises(ValueError, sem.release)

    async def test_release_no_waiters(self) -> None:
        sem = MeteredSemaphore()
        await sem.acquire()
        self.assertTrue(sem.locked())

        sem.release()
        self.assertFalse(sem.locked())

    async def test_acquire_fifo_order(self) -> None:
        sem = MeteredSemaphore(1)
        result = []

        async def coro(tag: str) -> None:
            await sem.acquire()
            result.append(f"{tag}_1")
            await asyncio.sleep(0.01)
            sem.release()

            await sem.acquire()
            result.append(f"{tag}_2")
            await asyncio.sleep(0.01)
            sem.release()

        async with asyncio.TaskGroup() as tg:
            tg.create_task(coro("c1"))
            tg.create_task(coro("c2"))
            tg.create_task(coro("c3"))

        self.assertEqual(["c1_1", "c2_1", "c3_1", "c1_2", "c2_2", "c3_2"], result)

    async def test_acquire_fifo_order_2(self) -> None:
        sem = MeteredSemaphore(1)
        result = []

        async def c1(result: list[int]) -> bool:
            await sem.acquire()
            result.append(1)
            return True

        async def c2(result: list[int]) -> bool:
            await sem.acquire()
            result.append(2)
            sem.release()
            await sem.acquire()
            result.append(4)
            return True

        async def c3(result: list[int]) -> bool:
            await sem.acquire()
            result.append(3)
            return True

        t1 = asyncio.create_task(c1(result))
        t2 = asyncio.create_task(c2(result))
        t3 = asyncio.create_task(c3(result))

        await asyncio.sleep(0)

        sem.release()
        sem.release()

        tasks = [t1, t2, t3]
        await asyncio.gather(*tasks)
        self.assertEqual([1, 2, 3, 4], result)

    async def test_acquire_fifo_order_3(self) -> None:
        sem = held(2)  # adapted: Semaphore(0), released twice
        result = []

        async def c1(result: list[int]) -> bool:
            await sem.acquire()
            result.append(1)
            return True

        async def c2(result: list[int]) -> bool:
            await sem.acquire()
            result.append(2)
            return True

        async def c3(result: list[int]) -> bool:
            await sem.acquire()
            result.append(3)
            return True

        t1 = asyncio.create_task(c1(result))
        t2 = asyncio.create_task(c2(result))
        t3 = asyncio.create_task(c3(result))

        await asyncio.sleep(0)

        t1.cancel()

        await asyncio.sleep(0)

        sem.release()
        sem.release()

        tasks = [t1, t2, t3]
        await asyncio.gather(*tasks, return_exceptions=True)
        self.assertEqual([2, 3], result)

    async def test_acquire_fifo_order_4(self) -> None:
        # Test that a successfule `acquire()` will wake up multiple Tasks
        # that were waiting in the Semaphore queue due to FIFO rules.
        sem = held(3)  # adapted: Semaphore(0), released three times
        result = []

        async def c1(result: list[int]) -> bool:
            # First task immediatlly waits for semaphore.  It will be awoken by c2.
            self.assertEqual(sem.available, 0)  # adapted: sem._value
            await sem.acquire()
            # We should have woken up all waiting tasks now.
            self.assertEqual(sem.available, 0)  # adapted: sem._value
            # Create a fourth task.  It should run after c3, not c2.
            nonlocal t4
            t4 = asyncio.create_task(c4(result))
            result.append(1)
            return True

        async def c2(result: list[int]) -> bool:
            # The second task begins by releasing semaphore three times,
            # for c1, c2, and c3.
            sem.release()
            sem.release()
            sem.release()
            self.assertEqual(sem.available, 2)  # adapted: sem._value
            # It is locked, because c1 hasn't woken up yet.
            self.assertTrue(sem.locked())
            await sem.acquire()
            result.append(2)
            return True

        async def c3(result: list[int]) -> bool:
            await sem.acquire()
            self.assertTrue(sem.locked())
            result.append(3)
            return True

        async def c4(result: list[int]) -> bool:
            result.append(4)
            return True

        t1 = asyncio.create_task(c1(result))
        t2 = asyncio.create_task(c2(result))
        t3 = asyncio.create_task(c3(result))
        t4: asyncio.Task[bool] | None = None

        await asyncio.sleep(0)
        # Three tasks are in the queue, the first hasn't woken up yet.
        self.assertEqual(sem.available, 2)  # adapted: sem._value
        # adapted: len(sem._waiters) == 3, which still lists c1 (handed its slot, not resumed)
        self.assertEqual(sem.queue_depth, 2)
        await asyncio.sleep(0)

        assert t4 is not None
        tasks = [t1, t2, t3, t4]
        await asyncio.gather(*tasks)
        self.assertEqual([1, 2, 3, 4], result)
