# The API service and the Ray head: the control plane only (no torch, no CUDA).
FROM python:3.12-slim
WORKDIR /app
COPY . .
# The same install script CI runs, in its control-plane mode.
RUN AUTOTUNER_ENGINE=none AUTOTUNER_DEV=0 PIP_CONSTRAINT=docker/constraints.txt bash scripts/setup.sh
ENV PATH=/app/.venv/bin:$PATH AUTOTUNER_HOST=0.0.0.0 AUTOTUNER_DATA_DIR=/data
VOLUME /data
EXPOSE 8000
ENTRYPOINT ["docker/entrypoint.sh"]
CMD ["api"]
