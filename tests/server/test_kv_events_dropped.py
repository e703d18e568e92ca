"""Dropped KV events reach the API process's /metrics the way the other engine counters do:
a real engine process (the embedded model, its publisher stuck behind a one-batch queue)
behind the API process's engine client; its step messages carry the count
(``SchedulerStats.num_kv_events_dropped``) and ``radixserve:kv_events_dropped_total`` shows
it, while every request still gets all its tokens."""

from __future__ import annotations

import asyncio

from kv_event_builds import embedded_with_stalled_events

from radixserve.cluster.dp_client import DataParallelClient
from radixserve.cluster.engine_supervisor import EngineSupervisor, RestartPolicy
from radixserve.cluster.routing import RoundRobinRouter
from radixserve.frontend.core_client import EngineCoreClient
from radixserve.frontend.http.metrics import ServerMetrics
from radixserve.frontend.output_buffer import OutputBuffer
from radixserve.messages import EngineCoreRequest
from radixserve.sampling_params import SamplingParams


def _dropped_line(text: str) -> float:
    lines = [x for x in text.splitlines() if x.startswith("radixserve:kv_events_dropped_total")]
    assert len(lines) == 1, lines
    return float(lines[0].rsplit(" ", 1)[1])


async def _generate(client: DataParallelClient, rid: str, prompt: list[int]) -> list[int]:
    buffer, tokens = OutputBuffer(), []
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    await client.add_request(EngineCoreRequest(request_id=rid, prompt_token_ids=prompt,
                                               sampling_params=params), buffer)
    while True:
        for out in await buffer.take():
            tokens += out.new_token_ids
            if out.finish_reason is not None:
                return tokens


def test_dropped_events_reach_metrics_while_generation_goes_on(tmp_path):
    async def main():
        engine = EngineCoreClient(f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out")
        supervisor = EngineSupervisor(engine, embedded_with_stalled_events, str(tmp_path),
                                      180, RestartPolicy())
        try:
            await supervisor.start()
            client = DataParallelClient([engine], RoundRobinRouter(1))
            metrics = ServerMetrics(client, "m", 2048)
            before = _dropped_line(metrics.render().decode())
            outputs = [await _generate(client, f"r{i}", [500 + 40 * i + t for t in range(48)])
                       for i in range(4)]
            await asyncio.sleep(0.2)  # the idle engine's last stats message
            return before, outputs, client.stats.num_kv_events_dropped, \
                _dropped_line(metrics.render().decode())
        finally:
            await supervisor.close(timeout=10)

    before, outputs, stats_dropped, after = asyncio.run(main())
    assert before == 0
    assert [len(o) for o in outputs] == [10] * 4
    assert stats_dropped > 0 and after == stats_dropped
