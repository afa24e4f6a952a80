"""What the chain and the run spec fix beyond the header's own fields: the commit's nonce, at least one
gradient, the run's codec and int8 block size, and no file fetched for names a header may not carry."""

import pytest
from payload_samples import GRAD_LENGTHS, KEY, LIMITS, context, make_contribution

from krill.payload import validate_contribution
from krill.payload.contribution import check_file_names, file_ref
from krill.payload.errors import ContextMismatchError, SchemaError
from krill.payload.header import HeaderBody


def test_the_header_must_name_the_nonce_of_its_commit():
    header, files = make_contribution()
    validate_contribution(header.encode(), files, LIMITS, context(nonce=3), GRAD_LENGTHS)
    with pytest.raises(ContextMismatchError) as info:
        validate_contribution(header.encode(), files, LIMITS, context(nonce=4), GRAD_LENGTHS)
    assert info.value.field == "header.nonce"


def test_a_contribution_without_a_gradient_is_refused():
    header, files = make_contribution()
    body = {**header.body().model_dump(), "files": {"rollouts.safetensors": header.files["rollouts.safetensors"]}}
    rollouts_only = HeaderBody(**body).sign(KEY)
    with pytest.raises(SchemaError, match="no gradient file") as info:
        validate_contribution(rollouts_only.encode(), files, LIMITS, context(), GRAD_LENGTHS)
    assert info.value.field == "header.files"


def test_the_run_fixes_the_codec_and_the_int8_block_size():
    header, files = make_contribution(codec="fp16")
    validate_contribution(header.encode(), files, LIMITS, context(codec="fp16"), GRAD_LENGTHS)
    with pytest.raises(SchemaError, match="codec 'fp16' not accepted") as info:
        validate_contribution(header.encode(), files, LIMITS, context(codec="int8-block"), GRAD_LENGTHS)
    assert info.value.field.endswith("__metadata__.codec")
    header, files = make_contribution(codec="int8-block")  # the samples' block size is 32
    validate_contribution(header.encode(), files, LIMITS, context(codec="int8-block", block_size=32), GRAD_LENGTHS)
    with pytest.raises(SchemaError, match="block_size 32, the run's is 256"):
        validate_contribution(header.encode(), files, LIMITS, context(codec="int8-block", block_size=256),
                              GRAD_LENGTHS)


def test_file_names_are_checked_from_the_header_alone():
    header, _ = make_contribution()
    assert check_file_names(header, GRAD_LENGTHS) == {0: "grad-0.safetensors", 1: "grad-1.safetensors"}
    body = {**header.body().model_dump(), "files": {**header.files, "junk.bin": file_ref(b"x" * 100)}}
    with pytest.raises(SchemaError) as info:
        check_file_names(HeaderBody(**body).sign(KEY), GRAD_LENGTHS)
    assert info.value.field == "header.files.junk.bin"
    with pytest.raises(SchemaError) as info:
        check_file_names(header, {0: GRAD_LENGTHS[0]})  # shard 1 is not a shard of this model
    assert info.value.field == "header.files.grad-1.safetensors"
