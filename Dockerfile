# The tracekit demo services (ranker, pricing, load generator) in one image.
#   docker compose up        # see docker-compose.yml and docs/demo.md
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # The ranker runs its model on one intra-op thread (see tracekit/demo/service.py).
    OMP_NUM_THREADS=1 \
    MKL_NUM_THREADS=1

WORKDIR /app

# torch first, from the PyTorch CPU index: the default index would pull the CUDA build.
RUN pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY tracekit ./tracekit
RUN pip install ".[demo]"

RUN useradd --create-home --uid 10001 demo
USER demo

EXPOSE 8000 8001
CMD ["python", "-m", "tracekit.demo.service"]
