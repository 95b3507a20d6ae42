"""Decodes serialized ConfigProtos with Python TensorFlow's own message class.

Reads one base64 ConfigProto per line on stdin; prints one JSON object per line with the fields
package tf sets, as TensorFlow reads them, and the message re-serialized deterministically.
"""

import base64
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tensorflow.core.protobuf import config_pb2  # noqa: E402

for line in sys.stdin:
    config = config_pb2.ConfigProto.FromString(base64.b64decode(line.strip()))
    gpu, graph = config.gpu_options, config.graph_options
    print(json.dumps({
        "intra_op_parallelism_threads": config.intra_op_parallelism_threads,
        "inter_op_parallelism_threads": config.inter_op_parallelism_threads,
        "allow_soft_placement": config.allow_soft_placement,
        "log_device_placement": config.log_device_placement,
        "allow_growth": gpu.allow_growth,
        "visible_device_list": gpu.visible_device_list,
        "per_process_gpu_memory_fraction": gpu.per_process_gpu_memory_fraction,
        "global_jit_level": graph.optimizer_options.global_jit_level,
        "auto_mixed_precision": graph.rewrite_options.auto_mixed_precision,
        "set_fields": sorted(f.name for f, _ in config.ListFields()),
        "reserialized": base64.b64encode(config.SerializeToString(deterministic=True)).decode(),
    }))
