STUDY_GPUS=0,1 STUDY_TAG=composed STUDY_RAY=local bash benchmarks/gpu/run-studies.sh benchmarks/jobs/qwen2-7b-grpo-8gpu.yaml
STUDY_GPUS=0 STUDY_TAG=composed STUDY_RAY=local STUDY_RESUME=benchmarks/results/resume bash benchmarks/gpu/run-studies.sh benchmarks/jobs/qwen2-7b-grpo-8gpu.yaml
STUDY_GPUS=0 STUDY_TAG=composed STUDY_RAY=local STUDY_RESUME=benchmarks/results/resume bash benchmarks/gpu/run-studies.sh benchmarks/jobs/qwen2-7b-grpo-8gpu.yaml
STUDY_GPUS=0 STUDY_TAG=composed STUDY_RAY=local STUDY_RESUME=benchmarks/results/resume bash benchmarks/gpu/run-studies.sh benchmarks/jobs/qwen2-7b-grpo-8gpu.yaml
STUDY_GPUS=0 STUDY_TAG=composed STUDY_RAY=local STUDY_RESUME=benchmarks/results/resume bash benchmarks/gpu/run-studies.sh benchmarks/jobs/qwen2-7b-grpo-8gpu.yaml
STUDY_GPUS=0 STUDY_TAG=composed STUDY_RAY=local STUDY_RESUME=benchmarks/results/resume bash benchmarks/gpu/run-studies.sh benchmarks/jobs/qwen2-7b-grpo-8gpu.yaml
