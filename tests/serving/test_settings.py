"""What `image-classifier serve` is told: an alias reference is followed, a version is pinned, and the bearer
token never shows where settings are printed or logged."""

from tasks.serving.settings import ServeSettings


def test_an_alias_reference_is_followed_and_a_version_or_folder_is_pinned():
    assert ServeSettings(model="colours@production").follows_alias
    assert not ServeSettings(model="colours/3").follows_alias
    assert not ServeSettings(model="runs/run-1/model").follows_alias


def test_the_batch_wait_is_given_in_milliseconds_and_used_in_seconds():
    assert ServeSettings(model="colours/3", max_wait_ms=25).max_wait_s == 0.025


def test_the_token_never_shows_when_the_settings_are_printed():
    settings = ServeSettings(model="colours@production", host="0.0.0.0", token="s3cret-token")
    assert "s3cret-token" not in repr(settings) and "s3cret-token" not in str(settings)
    assert settings.token == "s3cret-token"
