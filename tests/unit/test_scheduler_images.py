"""The scheduler and block manager with images (no model): a prefill chunk never ends inside an
image's tokens, and an image's blocks are keyed by its digest as well as its placeholder ids."""
from mlxr.engine.records import EngineCoreRequest, ImageInput, ModelRunnerOutput
from mlxr.engine.sched.block_manager import BlockManager
from mlxr.engine.sched.request import Request
from mlxr.engine.sched.scheduler import Scheduler, SchedulerConfig
from mlxr.types import SamplingParams

IMAGE_ID = 9


def image_req(rid: int, spans: list[tuple[int, int]], n: int = 40, digest: bytes = b"a" * 32) -> Request:
    ids = list(range(10, 10 + n))
    images = []
    for offset, length in spans:
        ids[offset:offset + length] = [IMAGE_ID] * length
        images.append(ImageInput(digest, offset, length, b"", [3, 1, 1]))
    return Request(EngineCoreRequest(f"r{rid}", ids, SamplingParams(), 4, [2], float(rid), images))


def chunks(sch: Scheduler, steps: int) -> list[tuple[int, int]]:
    seen = []
    for _ in range(steps):
        out = sch.schedule()
        if out.is_empty:
            break
        start, n = out.num_computed_tokens[0], out.num_scheduled_tokens[0]
        seen.append((start, start + n))
        rid = out.request_ids[0]
        req = sch.requests[rid]
        sampled = [rid] if start + n == len(req.token_ids) else []  # the prompt's last chunk samples
        sch.update_from_output(out, ModelRunnerOutput(sampled, [[7] for _ in sampled]))
    return seen


def test_a_chunk_stops_before_an_image_and_carries_a_long_one_whole():
    sch = Scheduler(SchedulerConfig(8, 10, 1024), BlockManager(64, 4, False))
    sch.add(image_req(0, [(6, 16), (25, 4)]))
    # 0-6 stops at the image; 6-22 is the whole 16-token image over the budget of 10; 22-32
    # holds the second image whole within the budget.
    assert chunks(sch, 4) == [(0, 6), (6, 22), (22, 32), (32, 40)]


def test_image_blocks_are_keyed_by_the_image_digest():
    bm = BlockManager(64, 4, True)
    sch = Scheduler(SchedulerConfig(8, 64, 1024), bm)
    first = image_req(0, [(8, 16)], digest=b"a" * 32)
    sch.add(first)
    chunks(sch, 1)
    bm.commit_full_blocks(first)
    same, other = image_req(1, [(8, 16)], digest=b"a" * 32), image_req(2, [(8, 16)], digest=b"b" * 32)
    assert bm.match_prefix(same) == 36  # every full block but the last token's
    assert bm.match_prefix(other) == 8  # the two text blocks before the image only
