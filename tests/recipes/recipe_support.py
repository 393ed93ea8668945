"""Shared test input for the recipe tests."""

# A small document: enough for several 64-token chunks.
TEXT = " ".join(
    f"Paragraph {i} notes that the heron waits at the river bank while the {i}th boat "
    f"passes, and the keeper writes the time in a small red book."
    for i in range(40)
)
