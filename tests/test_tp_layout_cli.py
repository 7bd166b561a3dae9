"""`coursekit layout`: the rank -> mesh coordinate map and its groups, as the trainer builds them (no processes)."""
import json
import subprocess
import sys


def _run(*args):
    return subprocess.run([sys.executable, "-m", "coursekit.cli", "layout", *args], capture_output=True, text=True,
                          timeout=60)


def test_layout_json_gives_each_rank_its_coordinate_groups_and_node():
    out = _run("--nproc", "16", "--tp", "8", "--pp", "2", "--gpus-per-node", "8", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    r9 = doc["ranks"][9]
    assert r9["node"] == 1 and r9["coords"]["pp"] == 1 and r9["coords"]["tp"] == 1
    assert r9["groups"]["tp"] == list(range(8, 16)) and r9["groups"]["pp"] == [1, 9]
    # TP (8 ranks, innermost) fits an 8-GPU node; the 2 pipeline stages sit on different nodes
    assert doc["placement"] == {"pp": "crosses nodes", "tp": "intra-node"}


def test_layout_table_and_a_tp_group_spanning_nodes_is_flagged():
    out = _run("--nproc", "8", "--tp", "4", "--gpus-per-node", "2")
    assert out.returncode == 0, out.stderr
    assert "tp: crosses nodes" in out.stdout and "dp_replicate: crosses nodes" in out.stdout
    assert len([l for l in out.stdout.splitlines() if l.strip()[:1].isdigit()]) == 8


def test_layout_with_fsdp2_fills_the_shard_axis_and_bad_layouts_exit_2():
    doc = json.loads(_run("--nproc", "8", "--tp", "2", "--cp", "2", "--strategy", "fsdp2", "--json").stdout)
    assert doc["layout"]["dp_shard"] == 2 and doc["layout"]["dp_replicate"] == 1
    bad = _run("--nproc", "6", "--tp", "4")
    assert bad.returncode == 2 and bad.stderr.startswith("error: world size 6 is not divisible by tp 4")
