"""The torchrun training worker and what it needs: plain PyTorch, no Prefect import."""
