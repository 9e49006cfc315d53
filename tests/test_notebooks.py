"""Every notebook under experiments/notebooks runs from top to bottom without an error."""
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "experiments" / "notebooks").glob("*.ipynb"))


def test_there_is_a_notebook():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, tmp_path, monkeypatch):
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend turns plots into PNG outputs
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO)}})
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any error
    text = "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for out in cell.get("outputs", []))
    assert "imbalance factor" in text
    images = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
              if "image/png" in out.get("data", {})]
    assert images, "the notebook's plots came out as images"
    nbformat.write(notebook, tmp_path / path.name)  # the executed copy, for inspection after a failure
