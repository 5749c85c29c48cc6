"""The scheduler's rules about actors, each alone (sweeper.run.actor_policies): retries after an
actor's death, the hand-over of a finished group's actor, and the groups held until the group
computing their fidelity reference is placed. The scheduler doing what they decide, on a
scripted cluster: test_sweep_run.py; over real Ray actors: test_faults.py, test_scheduling.py."""

from __future__ import annotations

from sweeper.plan.expand import TrialGroup, make_plan
from sweeper.plan.spec import parse_sweep
from sweeper.run.actor_policies import HandOver, OpenGroup, ReferenceReaders, Retries

ONE_GPU = {"num_gpus": 1, "num_cpus": 1}


def _groups(**sweep) -> list[TrialGroup]:
    plan = make_plan(parse_sweep({"name": "policies", "models": ["tiny-llama"], "batch_sizes": [1, 2],
                                  "workload": {"input_len": 8, "output_len": 4}, **sweep}), "cuda", check_hub=False)
    return plan.groups(plan.runnable)


def test_work_is_retried_while_its_actor_died_at_most_max_retries_times_on_it():
    two = Retries(max_retries=2)
    decisions = [two.after_death(before) for before in range(3)]
    assert [(d.retry, d.deaths) for d in decisions] == [(True, 1), (True, 2), (False, 3)]
    assert Retries(max_retries=0).after_death(0).retry is False  # no retries: the first death records it


def test_a_finished_group_s_actor_goes_on_to_the_first_waiting_group_it_can_serve():
    by = {(g.backend, g.trials[0].precision): g for g in _groups(backends=["transformers", "vllm", "noop"],
                                                                 precisions=["bf16", "fp16"])}

    def seen(key, waiting=True, resources=ONE_GPU):
        return OpenGroup(key=key, group=by[key], resources=resources, waiting=waiting)

    done = seen(("transformers", "bf16"), waiting=False)
    # transformers leaves a CUDA context in the actor's process, where vLLM's engine processes
    # would find it: the vLLM group is passed over for the next transformers one.
    waiting = [seen(("vllm", "bf16")), seen(("transformers", "fp16"))]
    assert HandOver.successor(done, waiting) == ("transformers", "fp16")
    # Loading, not waiting: its own actor is placed already. Other resources: another slot's.
    assert HandOver.successor(done, [seen(("transformers", "fp16"), waiting=False)]) is None
    assert HandOver.successor(done, [seen(("noop", "bf16"), resources={"num_gpus": 2, "num_cpus": 1})]) is None
    # In start order: the first that qualifies, vLLM after a backend that leaves no context.
    after_noop = seen(("noop", "bf16"), waiting=False)
    assert HandOver.successor(after_noop, [seen(("vllm", "fp16")), seen(("noop", "fp16"))]) == ("vllm", "fp16")
    assert HandOver.successor(done, [done]) is None  # never itself


def test_a_group_reading_another_s_fidelity_reference_waits_for_that_group():
    groups = _groups(backends=["transformers"], precisions=["bf16", "int8", "nf4"], fidelity={"reference": "bf16"})
    precision = [g.trials[0].precision for g in groups]
    provider = precision.index("bf16")
    held = ReferenceReaders.held(groups)
    assert {precision[r]: precision[p] for r, p in held.items()} == {"int8": "bf16", "nf4": "bf16"}
    assert provider not in held
    assert ReferenceReaders.held(_groups(backends=["transformers"], precisions=["bf16", "int8"])) == {}
