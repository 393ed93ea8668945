"""The graph core: session graphs, their ops, objectives, the scheduler over them."""
