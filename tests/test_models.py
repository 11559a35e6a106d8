import pytest
import torch

import workshop_utils as wu


@pytest.mark.parametrize("name, expected", [("simplecnn", 2_474_506), ("resnet18", 11_173_962)])
def test_parameter_counts_are_exact(name, expected):
    model = wu.build_model(name)
    assert wu.count_parameters(model) == expected
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_resnet_keeps_cifar_resolution():
    model = wu.build_model("resnet18")
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, torch.nn.Identity)


def test_unknown_model_names_the_choices():
    with pytest.raises(wu.WorkshopError, match="Unknown model 'vgg'.*'simplecnn'"):
        wu.build_model("vgg")


def test_unwrap_strips_ddp_and_compile_wrappers():
    model = wu.build_model("simplecnn")
    assert wu.unwrap(torch.nn.DataParallel(model)) is model
    assert wu.unwrap(torch.compile(model)) is model
