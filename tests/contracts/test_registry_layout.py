from tasks.registry import default_model_name


def test_default_model_name_comes_from_the_data_set():
    assert default_model_name("/data/digits/train", "resnet18") == "digits-resnet18"
    assert default_model_name("/data/My Pets.zip", "densenet121") == "my-pets-densenet121"
