"""verl's example commands as baselines: the right script for the model's size, its knobs
within the job's space, every move named."""

from autotuner.baselines import EXAMPLES, citation, example_baseline, example_script
from autotuner.knobs import KNOBS, A, R
from autotuner.space import SearchSpace
from autotuner.spec import parse_job_spec


def _space(model: str, n_gpus: int):
    spec = parse_job_spec(
        {
            "workload": {
                "model": model,
                "train_batch_size": 64,
                "n": 8,
                "ppo_mini_batch_size": 16,
                "max_prompt_length": 512,
                "max_response_length": 3072,
            },
            "cluster": {"device": "cuda", "n_gpus_per_node": n_gpus},
        }
    )
    arch = spec.validate_model()
    space = SearchSpace.build(spec, arch, "cuda")
    return space, {p: [v] for p, v in space.fixed.items()} | space.searched, arch


def test_the_script_follows_the_model_size() -> None:
    assert example_script(1_500_000_000).endswith("run_qwen3_4b_fsdp.sh")
    assert example_script(7_600_000_000).endswith("run_qwen3_8b_fsdp.sh")
    # Every key the scripts set is a knob of the table (a renamed knob breaks this).
    assert {k for keys in EXAMPLES.values() for k in keys} - set(KNOBS) <= {
        R + "checkpoint_engine.update_weights_bucket_megabytes"
    }


def test_values_outside_the_space_move_to_the_nearest_and_say_so() -> None:
    _, allowed, arch = _space("qwen2.5-1.5b", 1)
    baseline = example_baseline(arch.num_parameters, allowed)
    for path, value in baseline.config.items():
        assert value in allowed[path], path
    # TP 2 does not fit one GPU; a 3000-token budget is below the 3584-token longest sequence.
    assert baseline.repairs[R + "tensor_model_parallel_size"] == (2, 1)
    old, new = baseline.repairs[A + "ppo_max_token_len_per_gpu"]
    assert old == 3000 and new >= 3584
    assert "run_qwen3_4b_fsdp.sh" in citation(baseline) and "tensor_model_parallel_size 2 -> 1" in citation(
        baseline
    )


def test_an_8b_model_on_eight_gpus_keeps_the_scripts_tp() -> None:
    _, allowed, arch = _space("qwen2-7b", 8)
    baseline = example_baseline(arch.num_parameters, allowed)
    assert baseline.script.endswith("run_qwen3_8b_fsdp.sh")
    assert baseline.config[R + "tensor_model_parallel_size"] == 2
    assert (
        baseline.config[A + "ppo_max_token_len_per_gpu"] == 24576
        or A + "ppo_max_token_len_per_gpu" in baseline.repairs
    )
    assert R + "tensor_model_parallel_size" not in baseline.repairs
