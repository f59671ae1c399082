"""Event files written by the real writers lossguard must read: tensorboardX's SummaryWriter (TF1
`simple_value`) and TensorBoard's own protos and EventFileWriter (TF2-style rank-0 tensors)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_tb1(folder: Path, points: list[tuple[int, str, float]]) -> Path:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(logdir=str(folder))
    for step, tag, value in points:
        writer.add_scalar(tag, value, global_step=step)
    writer.close()
    return next(folder.glob("events.out.tfevents.*"))


def tensor_event(step: int, tag: str, value: float, *, dtype: str = "float32", how: str = "content", wall: float = 1.7e9):
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

    tensor = tensor_pb2.TensorProto(tensor_shape=tensor_shape_pb2.TensorShapeProto())
    np_type = {"float32": np.float32, "float64": np.float64, "half": np.float16}[dtype]
    tensor.dtype = {"float32": types_pb2.DT_FLOAT, "float64": types_pb2.DT_DOUBLE, "half": types_pb2.DT_HALF}[dtype]
    if how == "content":
        tensor.tensor_content = np.array(value, dtype=np_type).tobytes()
    elif dtype == "float32":
        tensor.float_val.append(value)
    elif dtype == "float64":
        tensor.double_val.append(value)
    else:
        tensor.half_val.append(int(np.array(value, dtype=np.float16).view(np.uint16)))
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=meta)])
    return event_pb2.Event(wall_time=wall + step, step=step, summary=summary)


def write_tb2(folder: Path, events: list, *, suffix: str = "") -> Path:
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    folder.mkdir(parents=True, exist_ok=True)
    before = set(folder.glob("events.out.tfevents.*"))
    writer = EventFileWriter(str(folder), filename_suffix=suffix)
    writer.add_event(event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2"))
    for event in events:
        writer.add_event(event)
    writer.close()
    (path,) = set(folder.glob("events.out.tfevents.*")) - before
    return path
