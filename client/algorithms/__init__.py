"""What a silo computes for each algorithm, on tensors: no Flower here (the ClientApp does the messaging)."""
