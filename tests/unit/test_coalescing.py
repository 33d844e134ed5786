"""The core link's writes (core/protocol.py `Coalescing`): the lines of one event-loop turn go out
in one write, in order, and every sender learns what became of its line."""

from __future__ import annotations

import anyio
import pytest

from corral.core.protocol import Coalescing


class Pipe:
    def __init__(self, *, fail: BaseException | None = None, full: bool = False) -> None:
        self.writes: list[bytes] = []
        self.fail = fail
        self.writing = anyio.Event()  # a write has begun
        self.drained = anyio.Event()  # a full pipe's writes go on (its reader read)
        if not full:
            self.drained.set()

    async def write(self, data: bytes) -> None:
        self.writing.set()
        await self.drained.wait()
        if self.fail is not None:
            raise self.fail
        self.writes.append(data)


def test_the_lines_of_one_turn_go_out_in_one_write_in_order() -> None:
    async def main() -> None:
        pipe = Pipe()
        out = Coalescing(pipe.write)
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(out.send, b"%d\n" % i)
        assert pipe.writes == [b"".join(b"%d\n" % i for i in range(8))]

    anyio.run(main)


def test_a_send_returns_once_its_line_is_written() -> None:
    async def main() -> None:
        pipe = Pipe()
        out = Coalescing(pipe.write)
        await out.send(b"a\n")
        assert pipe.writes == [b"a\n"]
        await out.send(b"b\n")
        assert pipe.writes == [b"a\n", b"b\n"]

    anyio.run(main)


def test_lines_sent_while_a_write_waits_follow_it_in_order() -> None:
    async def main() -> None:
        pipe = Pipe(full=True)
        out = Coalescing(pipe.write)
        async with anyio.create_task_group() as tg:
            tg.start_soon(out.send, b"first\n")
            await pipe.writing.wait()  # the first write is under way, and waits
            for i in range(3):
                tg.start_soon(out.send, b"%d\n" % i)
            await anyio.wait_all_tasks_blocked()  # all three joined the next batch
            pipe.drained.set()
        assert pipe.writes == [b"first\n", b"0\n1\n2\n"]

    anyio.run(main)


def test_every_sender_of_a_failed_write_gets_its_error() -> None:
    async def main() -> None:
        pipe = Pipe(fail=anyio.BrokenResourceError("the core is gone"))
        out = Coalescing(pipe.write)
        failed: list[BaseException] = []

        async def send(line: bytes) -> None:
            try:
                await out.send(line)
            except anyio.BrokenResourceError as err:
                failed.append(err)

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(send, b"%d\n" % i)
        assert len(failed) == 3
        pipe.fail = None
        await out.send(b"next\n")  # the next turn writes again
        assert pipe.writes == [b"next\n"]

    anyio.run(main)


def test_a_writer_cancelled_before_it_wrote_fails_the_lines_it_carried() -> None:
    async def main() -> None:
        pipe = Pipe()
        out = Coalescing(pipe.write)
        joined: list[BaseException] = []

        async def join() -> None:
            with pytest.raises(anyio.BrokenResourceError) as err:
                await out.send(b"joined\n")
            joined.append(err.value)

        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as scope:
                scope.cancel()  # the first sender is cancelled at its turn of the loop
                tg.start_soon(join)
                await out.send(b"first\n")
        assert pipe.writes == [] and len(joined) == 1

    anyio.run(main)
