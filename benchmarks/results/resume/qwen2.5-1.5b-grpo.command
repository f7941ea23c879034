STUDY_GPUS=0,1,2,3 STUDY_RAY=local bash benchmarks/gpu/run-studies.sh benchmarks/jobs/qwen2.5-1.5b-grpo.yaml
STUDY_GPUS=0,1,2,3 STUDY_RAY=local STUDY_RESUME=benchmarks/results/resume bash benchmarks/gpu/run-studies.sh benchmarks/jobs/qwen2.5-1.5b-grpo.yaml
STUDY_GPUS=0,1 STUDY_RAY=local STUDY_RESUME=benchmarks/results/resume bash benchmarks/gpu/run-studies.sh benchmarks/jobs/qwen2.5-1.5b-grpo.yaml
