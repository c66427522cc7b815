"""`gpufair submit` with a partition profile or an amount of CU, and what `gpufair explain` says
of them, on the heterogeneous example (A100 with the MIG table, V100, RTX 4090)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufair.api.server import RunningServer
from gpufair.cli import main
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "clusters"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_submit_and_explain_a_partition_and_a_cu_request(
    client: GpufairClient, server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{server.port}"
    client.apply_config(load_config_file(EXAMPLES / "heterogeneous.yaml"))
    code, out, err = run(
        capsys, "submit", "nb-1", "--queue", "fine-tuning", "--pool", "main",
        "--partition-profile", "3g.40gb", "--pods", "2", "--address", address,
    )  # fmt: skip
    assert code == 0, err
    assert out.strip() == "submitted nb-1: 2 × 3g.40gb partition in queue fine-tuning, pool main"
    code, out, err = run(
        capsys, "submit", "sweep-1", "--queue", "fine-tuning", "--pool", "main",
        "--compute-units", "20", "--gpu-type", "a100-80gb", "--gpu-type", "v100-16gb",
        "--address", address,
    )  # fmt: skip
    assert code == 0, err
    assert out.strip() == "submitted sweep-1: 20 CU in queue fine-tuning, pool main"

    code, out, err = run(capsys, "explain", "nb-1", "--address", address)
    assert code == 0, err
    # 3/7 of a 10 CU A100, as the example declares the share (0.428571).
    assert "Each pod asks for one 3g.40gb partition (0.429 of a GPU), offered here by " in out
    assert "a100-80gb (4.286 CU each)" in out
    code, out, err = run(capsys, "explain", "sweep-1", "--address", address)
    assert code == 0, err
    assert (
        "It asks for 20 CU; placement tries, in order: 5 × v100-16gb = 20 CU; "
        "2 × a100-80gb = 20 CU." in out
    )
    assert "needs 20 CU" in out
