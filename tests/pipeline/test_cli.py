"""The commands as the README shows them, on examples/lake.yaml, against the real stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bergstream.core.config import load_config
from bergstream.pipeline.settings import pipeline_lake
from tests.kits.lake import Produced, produce

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lake.yaml"


def test_example_config_is_valid(tmp_path: Path):
    env = {"BERGSTREAM_HOME": str(tmp_path), "BERGSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:9092"}
    config = load_config(EXAMPLE, env=env)
    assert config.lake is not None
    lake = pipeline_lake(config, home=tmp_path)
    assert lake.catalog_type == "sql" and lake.namespace == "coldset"
    assert lake.sqlite_path == tmp_path / "lake" / "catalog.db"
    assert lake.warehouse == f"file://{tmp_path}/lake/warehouse"
    assert lake.checkpoint_dir == tmp_path / "lake" / "checkpoints"


@pytest.mark.slow
def test_run_maintain_describe(
    kafka_bootstrap: str, create_topic: Callable[..., str], tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "BERGSTREAM_HOME": str(tmp_path),
        "BERGSTREAM_KAFKA_BOOTSTRAP": kafka_bootstrap,
    }

    def bergstream(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [BERGSTREAM, *args, "-c", str(EXAMPLE)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )

    topic = create_topic(2, prefix="cli")
    produce(
        kafka_bootstrap,
        topic,
        [Produced(i % 2, None, f"v{i}".encode(), (), None) for i in range(50)],
    )

    run = bergstream("pipeline", "run", "--topic", topic, "--once")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)  # stdout holds only the JSON summary
    assert summary["records"] == 50 and summary["boundary"] == {"0": 25, "1": 25}
    assert "batch 0: +50 records" in run.stderr and "offsets 0:25 1:25" in run.stderr

    maintained = bergstream("pipeline", "maintain", "--topic", topic)
    assert maintained.returncode == 0, maintained.stderr[-3000:]
    report = json.loads(maintained.stdout)
    assert report["boundary_after"] == {"0": 25, "1": 25}

    described = bergstream("table", "describe", "--topic", topic)
    assert described.returncode == 0, described.stderr
    facts = json.loads(described.stdout)
    assert facts["rows"] == 50 and facts["boundary"] == {"0": 25, "1": 25}
    assert facts["table"] == f"coldset.{topic}"

    missing = bergstream("pipeline", "run", "--topic", f"{topic}-missing", "--once")
    assert missing.returncode == 1
    assert f"topic '{topic}-missing' does not exist" in missing.stderr
