# The service's one image: web (daphne), engine workers, celery beat and the light celery worker
# all run it (docker-compose.yml builds it once, as mlx-inference-service:local).
FROM python:3.11-slim

# The fast BLAS for mlx on Linux (engine_worker/runner/blas.py): Debian's OpenBLAS, which picks its
# kernels for the CPU at run time, and the Fortran runtime that cmeel-openblas (a pip dependency,
# built for AVX-512 CPUs) needs. Without them mlx falls back to its reference BLAS, many times
# slower.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libopenblas0-pthread libgfortran5 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md manage.py ./
COPY engine_worker engine_worker
COPY demo_model demo_model
COPY api api
COPY inference_service inference_service
COPY templates templates
RUN pip install --no-cache-dir -e .
# A checkout without the trained demo weights (demo_model/demo) serves the untrained test
# model instead, as `make run` does; settings.py picks whichever is there when MODEL_PATH is unset.
RUN test -f demo_model/demo/model.safetensors || python -m demo_model.builder /app/var/models/tiny

ENV PYTHONUNBUFFERED=1
EXPOSE 8000
