"""Reads a TensorBoard event file with TensorBoard's own reader (PyPI's `tensorboard`, which checks every record's
CRC-32C) and writes what it holds as JSON: the file version, each scalar (tag -> [[step, value], ...]) and each
text (tag -> [[step, text], ...]). tests/train/tensorboard_test.cpp compares the committed output with the values
trl.cpp's writer was given.

  python3 -m venv /tmp/tb && /tmp/tb/bin/pip install tensorboard
  /tmp/tb/bin/python tests/reference/tensorboard_events.py tests/data/tensorboard/events.golden tests/data/tensorboard/events.golden.json
"""
import json
import sys

from tensorboard.backend.event_processing import event_file_loader
from tensorboard.util import tensor_util


def main(path, out):
    result = {"file_version": None, "scalars": {}, "texts": {}, "events": 0}
    for event in event_file_loader.LegacyEventFileLoader(path).Load():
        result["events"] += 1
        if event.HasField("file_version"):
            result["file_version"] = event.file_version
        for value in event.summary.value:
            if value.HasField("simple_value"):
                result["scalars"].setdefault(value.tag, []).append([event.step, value.simple_value])
            elif value.HasField("tensor"):
                assert value.metadata.plugin_data.plugin_name == "text", value.metadata
                texts = tensor_util.make_ndarray(value.tensor)
                result["texts"].setdefault(value.tag, []).append([event.step, [t.decode("utf-8") for t in texts.flatten()]])
    with open(out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
