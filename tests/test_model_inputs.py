"""A zoo model handed something other than a float (B, C, H, W) tensor says what it takes in one line."""

import numpy as np
import pytest
import torch

import vitzoo

MODELS = {
    "vit": lambda: vitzoo.create_model("vit_cifar", depth=1, num_classes=3),
    "resnet": lambda: vitzoo.create_model("nonlocal_resnet18_cifar", num_classes=3),
}
EXPECTED = "the model takes a float tensor (B, 3, H, W) of normalised images"
CASES = {
    "one image": (torch.rand(3, 32, 32), r"not a 3-D tensor of shape \(3, 32, 32\); add the batch axis"),
    "numpy": (np.zeros((1, 32, 32, 3), np.float32), r"not a numpy array: torch.from_numpy"),
    "uint8": (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), r"not torch.uint8 pixels: x.float\(\) / 255"),
    "channels last": (torch.rand(1, 32, 32, 3), r"not shape \(1, 32, 32, 3\); channels last\? x.permute"),
}


@pytest.mark.parametrize("backbone", MODELS)
def test_a_wrong_input_is_one_line_naming_the_expected_one(backbone):
    model = MODELS[backbone]().eval()
    for name, (x, message) in CASES.items():
        with pytest.raises(
            (TypeError, ValueError), match=rf"^{EXPECTED.replace('(', '[(]').replace(')', '[)]')}, {message}"
        ) as err:
            model(x)
        assert "\n" not in str(err.value), name
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 3)
