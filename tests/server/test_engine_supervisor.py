"""EngineSupervisor on its own (no HTTP): the back-off sequence, and a replacement engine
that cannot start is retried a bounded number of times before the supervisor gives up."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time

from supervisor_builds import mock_unless_marker

from radixserve.frontend.core_client import EngineCoreClient
from radixserve.cluster.engine_supervisor import EngineSupervisor, RestartPolicy


def test_the_back_off_doubles_from_an_immediate_first_restart_up_to_its_cap():
    policy = RestartPolicy(base_delay_s=0.5, max_delay_s=3.0)
    assert [policy.delay(n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]


def test_restarts_that_fail_are_bounded_then_the_supervisor_gives_up(tmp_path):
    marker = str(tmp_path / "broken")
    build = functools.partial(mock_unless_marker, marker)
    policy = RestartPolicy(max_attempts=2, base_delay_s=0.2)

    async def main():
        client = EngineCoreClient(f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out")
        supervisor = EngineSupervisor(client, build, str(tmp_path), 60, policy)
        fatal: list[str] = []
        gave_up = asyncio.Event()
        restarts = []
        try:
            ready = await supervisor.start()
            assert ready.max_model_len == 4096 and client.dead is None
            supervisor.watch(lambda reason: (fatal.append(reason), gave_up.set()),
                             lambda: restarts.append(time.monotonic()))
            open(marker, "w").close()  # from now on the engine cannot load
            os.kill(supervisor.pid, signal.SIGKILL)
            killed = time.monotonic()
            await asyncio.wait_for(gave_up.wait(), 60)
            return fatal, restarts, killed, client.dead, client.queues
        finally:
            await supervisor.close(timeout=5)

    fatal, restarts, killed, dead, queues = asyncio.run(main())
    assert fatal == ["the engine process exited with code -9; gave up after 2 restart "
                     "attempts"]
    assert len(restarts) == 2
    assert restarts[0] - killed < 1.0  # the first restart is immediate
    assert restarts[1] - restarts[0] >= 0.2  # the second waits its back-off
    assert dead == ("the engine process exited with code -9; restart attempt 2 of 2 failed: "
                    "the engine failed to start: RuntimeError: the model file is gone")
    assert not queues
