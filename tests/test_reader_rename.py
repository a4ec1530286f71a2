"""CheckpointReader(folder, rename=...) presents every stored tensor under its new name, and refuses a rename that
gives two tensors one name."""

import pytest
import torch
from safetensors.torch import save_file

from fivefold.conversion import ConversionError
from fivefold.conversion.reader import CheckpointReader

TENSORS = {"old.a": torch.arange(6.0).reshape(2, 3), "old.b": torch.tensor([1, 2], dtype=torch.int64)}


@pytest.fixture(params=["model.safetensors", "pytorch_model.bin"])
def folder(request, tmp_path):
    if request.param.endswith(".safetensors"):
        save_file(TENSORS, str(tmp_path / request.param))
    else:
        torch.save(TENSORS, tmp_path / request.param)
    return tmp_path


def test_tensors_are_read_under_their_new_names(folder):
    reader = CheckpointReader(folder, rename=lambda key: key.replace("old.", "new."))
    assert reader.keys() == ["new.a", "new.b"]
    assert reader.shape("new.a") == (2, 3) and reader.dtype("new.b") == torch.int64
    assert torch.equal(reader.get("new.a"), TENSORS["old.a"])
    assert reader.file_of("new.b").parent == folder
    with pytest.raises(KeyError):
        reader.get("old.a")


def test_two_tensors_renamed_to_one_name_are_refused(folder):
    with pytest.raises(ConversionError, match=r"'old.a' \(.*\) and 'old.b' \(.*\) are both renamed to 'same'"):
        CheckpointReader(folder, rename=lambda key: "same")


def test_without_rename_the_stored_names(folder):
    assert CheckpointReader(folder).keys() == ["old.a", "old.b"]
