"""What each group's actor is asked for and handed (``sweeper.run.group_launch``), apart from
the scheduler that asks: Ray resources by device and backend, and the load request's secrets
taken from the driver's environment."""

from __future__ import annotations

from sweeper.plan.expand import make_plan
from sweeper.plan.spec import parse_sweep
from sweeper.run.cluster import ClusterInfo
from sweeper.run.group_launch import GroupLaunch

CPU = ClusterInfo(gpus=0, cpus=8, nodes=2, min_node_cpus=4)
GPUS = ClusterInfo(gpus=4, cpus=64, nodes=1, min_node_cpus=64)


def groups(device: str, **sweep):
    base = {"name": "g", "models": "tiny-llama", "precisions": "fp32", "batch_sizes": 1,
            "workload": {"input_len": 8, "output_len": 4}}
    merged = {k: v for k, v in {**base, **sweep}.items() if v is not None}
    return make_plan(parse_sweep(merged), device).groups()


def test_a_gpu_group_asks_for_its_width_and_a_cpu_group_for_a_whole_node():
    [tp2] = groups("cuda", backends="noop", tensor_parallel=2)
    assert GroupLaunch(GPUS).resources(tp2) == {"num_gpus": 2, "num_cpus": 1}
    [cpu] = groups("cpu")
    assert GroupLaunch(CPU).resources(cpu) == {"num_gpus": 0, "num_cpus": 4}  # no two trials share a node


def test_an_energy_site_places_the_actor_on_its_node_and_a_key_travels_with_the_load_alone():
    served = {"backends": "server", "batch_sizes": None, "workload": {"mode": "serving", "input_len": 8, "output_len": 4,
                                                  "request_rate": 1, "num_prompts": 2},
              "backend_options": {"server": {"base_url": "http://10.0.0.5:8000", "model": "m",
                                             "api_key_env": "TEST_LAUNCH_KEY",
                                             "energy": {"node": "10.0.0.5", "gpu_uuids": ["GPU-1"]}}}}
    [group] = groups("cpu", **served)
    launch = GroupLaunch(CPU, "/results/servers", environ={"TEST_LAUNCH_KEY": "sk-1", "OTHER": "x"})
    assert launch.resources(group) == {"num_gpus": 0, "num_cpus": 4, "resources": {"node:10.0.0.5": 0.001}}
    request = launch.load_request(group)
    assert request.server_log_dir == "/results/servers"
    assert request.secrets.get("TEST_LAUNCH_KEY") == "sk-1" and request.secrets.get("OTHER") is None
    # Not set in the driver's environment: nothing is sent (the plan said so beforehand).
    assert GroupLaunch(CPU, environ={}).load_request(group).secrets.get("TEST_LAUNCH_KEY") is None
