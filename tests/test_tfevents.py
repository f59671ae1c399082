"""Event files from real writers: TF1 simple_value (tensorboardX) and TF2-style tensors (TensorBoard's
protos), read in one go, in pieces as they grow, and with damage."""

from __future__ import annotations

import math

import struct

import numpy as np
import pytest

from lossguard.ingest.cursor import Cursor
from lossguard.ingest.reader import ReadOptions, read, read_paths
from lossguard.ingest.sources.tfrecord import masked_crc

from .writers import tensor_event, write_tb1, write_tb2

OPTIONS = ReadOptions()


def read_file(path, cursor=Cursor(), final=True):
    return read(path, cursor, run="r", fmt="tfevents", final=final, options=OPTIONS)


def test_tensorboardx_scalars_are_read_with_steps_tags_and_wall_time(tmp_path):
    points = [(s, tag, 10.0 / (s + 1) + k) for s in range(200) for k, tag in enumerate(["train/loss", "lr", "grad_norm"])]
    path = write_tb1(tmp_path / "run", points)
    res = read_file(path)
    assert res.problems == ()
    frame = res.frame
    assert frame.height == len(points)
    assert frame.select("step", "tag").rows() == [(s, t) for s, t, _ in points]
    assert np.allclose(frame.get_column("value").to_numpy(), np.float32([v for *_, v in points]))
    assert frame.get_column("wall_time").null_count() == 0
    assert set(frame.get_column("metric")) == {"loss", "lr", "grad_norm"}


def test_nan_and_inf_values_are_kept(tmp_path):
    path = write_tb1(tmp_path / "run", [(1, "loss", 2.0), (2, "loss", float("nan")), (3, "loss", float("inf")), (4, "loss", -float("inf"))])
    values = read_file(path).frame.get_column("value").to_list()
    assert values[0] == 2.0 and math.isnan(values[1]) and values[2] == math.inf and values[3] == -math.inf


@pytest.mark.parametrize(
    "dtype,how",
    [
        pytest.param("float32", "content", id="float32 tensor_content"),
        pytest.param("float64", "content", id="float64 tensor_content"),
        pytest.param("half", "content", id="half tensor_content"),
        pytest.param("float32", "val", id="float32 float_val"),
        pytest.param("float64", "val", id="float64 double_val"),
        pytest.param("half", "val", id="half half_val"),
    ],
)
def test_tf2_rank0_tensor_scalars_are_read(tmp_path, dtype, how):
    values = [3.0 - 0.01 * s for s in range(300)]
    path = write_tb2(tmp_path / "run", [tensor_event(s, "loss", v, dtype=dtype, how=how) for s, v in enumerate(values)])
    frame = read_file(path).frame
    assert frame.get_column("step").to_list() == list(range(300))
    want = np.array(values, dtype={"float32": np.float32, "float64": np.float64, "half": np.float16}[dtype])
    assert np.array_equal(frame.get_column("value").to_numpy(), want.astype(np.float64))
    assert frame.get_column("wall_time").to_list()[:2] == [1.7e9, 1.7e9 + 1]


def test_non_scalar_tensors_are_not_taken_for_scalars(tmp_path):
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=2)])
    vector = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=shape, float_val=[1.0, 2.0])
    text = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, tensor_shape=tensor_shape_pb2.TensorShapeProto(), string_val=[b"hi"])
    events = [
        event_pb2.Event(step=1, summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="hist", tensor=vector)])),
        event_pb2.Event(step=1, summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="note", tensor=text)])),
        tensor_event(1, "loss", 1.5),
    ]
    frame = read_file(write_tb2(tmp_path / "run", events)).frame
    assert frame.select("step", "tag", "value").rows() == [(1, "loss", 1.5)]


def test_event_with_several_values_keeps_all_in_order(tmp_path):
    from tensorboard.compat.proto import event_pb2, summary_pb2

    values = [summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in [("loss", 1.0), ("lr", 0.1), ("grad_norm", 3.0)]]
    event = event_pb2.Event(step=7, wall_time=5.0, summary=summary_pb2.Summary(value=values))
    frame = read_file(write_tb2(tmp_path / "run", [event])).frame
    assert frame.select("step", "tag", "value").rows() == [(7, "loss", 1.0), (7, "lr", pytest.approx(0.1)), (7, "grad_norm", 3.0)]


def test_several_event_files_in_one_run_folder_are_one_run(tmp_path):
    run = tmp_path / "runs" / "exp"
    write_tb2(run, [tensor_event(s, "loss", 2.0) for s in range(0, 50)], suffix=".a")
    write_tb2(run, [tensor_event(s, "loss", 1.0) for s in range(40, 90)], suffix=".b")  # preempted, resumed at 40
    frame, results, problems = read_paths([tmp_path / "runs"])
    assert problems == []
    assert len(results) == 2
    assert set(frame.get_column("run")) == {"exp"}
    assert frame.height == 100


def test_record_cut_off_at_the_end_is_left_for_the_next_read(tmp_path):
    full = write_tb1(tmp_path / "run", [(s, "loss", float(s)) for s in range(100)])
    data = full.read_bytes()
    growing = tmp_path / "growing" / full.name
    growing.parent.mkdir()
    growing.write_bytes(data[: len(data) - 7])
    first = read_file(growing, final=False)
    assert first.problems == ()
    assert first.frame.height == 99
    with open(growing, "ab") as fh:
        fh.write(data[len(data) - 7 :])
    second = read_file(growing, first.cursor, final=False)
    assert second.frame.select("step").rows() == [(99,)]
    assert second.cursor.offset == len(data)


def test_truncated_last_record_is_reported_on_a_final_read(tmp_path):
    full = write_tb1(tmp_path / "run", [(s, "loss", float(s)) for s in range(10)])
    full.write_bytes(full.read_bytes()[:-5])
    res = read_file(full, final=True)
    assert res.frame.height == 9
    assert len(res.problems) == 1 and "incomplete" in res.problems[0].message


def test_bad_data_checksum_skips_that_record_only(tmp_path):
    path = write_tb1(tmp_path / "run", [(s, "loss", float(s)) for s in range(20)])
    data = bytearray(path.read_bytes())
    # Flip a byte inside the data of the 6th record (the first is the file_version record).
    pos = 0
    for _ in range(5):
        (length,) = struct.unpack_from("<Q", data, pos)
        pos += 12 + length + 4
    data[pos + 14] ^= 0xFF
    path.write_bytes(bytes(data))
    res = read_file(path)
    assert res.frame.height == 19
    assert 4 not in res.frame.get_column("step").to_list()
    assert len(res.problems) == 1
    assert res.problems[0].offset == pos and "checksum" in res.problems[0].message
    assert not res.dead


def test_bad_length_checksum_marks_the_file_dead_after_reading_what_came_before(tmp_path):
    path = write_tb1(tmp_path / "run", [(s, "loss", float(s)) for s in range(20)])
    data = bytearray(path.read_bytes())
    pos = 0
    for _ in range(11):
        (length,) = struct.unpack_from("<Q", data, pos)
        pos += 12 + length + 4
    data[pos + 9] ^= 0x01  # damage the length's checksum
    path.write_bytes(bytes(data))
    res = read_file(path)
    assert res.dead
    assert res.frame.get_column("step").to_list() == list(range(10))
    assert res.problems[0].offset == pos
    assert f"@ byte {pos}" in str(res.problems[0])


def test_garbage_named_like_an_event_file_gives_one_problem(tmp_path):
    path = tmp_path / "events.out.tfevents.123.host"
    path.write_bytes(bytes(range(256)) * 40)
    res = read_file(path)
    assert res.frame.height == 0
    assert len(res.problems) == 1 and res.dead


def test_masked_crc_matches_tensorboards_own():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    for payload in [b"", b"a", struct.pack("<Q", 1234), bytes(range(200))]:
        assert masked_crc(payload) == masked_crc32c(payload)


def test_many_tags_and_step_widths_decode_like_the_protobuf_library(tmp_path):
    """The bulk decoder must agree with TensorBoard's own parser on a file full of shape changes."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    rng = np.random.default_rng(0)
    steps = np.sort(rng.integers(0, 2**40, size=600))
    tags = ["a", "loss", "train/loss", "lr-AdamW", "grad_norm", "x" * 130]
    points = [(int(s), tags[i % len(tags)], float(rng.normal())) for i, s in enumerate(steps)]
    path = write_tb1(tmp_path / "run", points)
    expected = []
    for raw in RawEventFileLoader(str(path)).Load():
        ev = event_pb2.Event.FromString(raw)
        for v in ev.summary.value:
            expected.append((ev.step, v.tag, float(np.float32(v.simple_value)), ev.wall_time))
    frame = read_file(path).frame
    assert frame.select("step", "tag", "value", "wall_time").rows() == expected


def test_real_hf_event_file_reads_in_small_chunks_like_in_one_go(corpus):
    from lossguard.ingest.formats.tfevents import TFEVENTS

    src = next((corpus / "tfevents/t5_summarization_hf_trainer").iterdir())
    whole = TFEVENTS.read(src, Cursor(), final=True).rows
    pieces = TFEVENTS.read(src, Cursor(), final=True, chunk=997).rows
    assert whole.height > 1000
    assert whole.equals(pieces)


def test_vectorised_crc_matches_the_crc32c_package():
    import crc32c

    from lossguard.ingest.sources.tfrecord import crc32c_rows

    rng = np.random.default_rng(1)
    for length in (0, 1, 8, 37, 300):
        rows = rng.integers(0, 256, size=(50, length), dtype=np.uint8)
        assert crc32c_rows(rows).tolist() == [crc32c.crc32c(r.tobytes()) for r in rows]


def test_framing_follows_a_pattern_that_changes_midway(tmp_path):
    # Step varints grow from 1 to 2 to 3 bytes at 128 and 16384: the record lengths' cycle changes.
    points = [(s, t, 0.5) for s in list(range(0, 300)) + list(range(16000, 16600)) for t in ("loss", "lr", "gn")]
    path = write_tb1(tmp_path / "run", points)
    frame = read_file(path).frame
    assert frame.select("step", "tag").rows() == [(s, t) for s, t, _ in points]
