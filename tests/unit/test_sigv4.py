"""core.sigv4 against the examples AWS publishes for Signature Version 4: the signing-key
derivation example of the AWS General Reference, and the "GET Object" example of the Amazon S3
API Reference (header-based authentication, empty payload)."""

from __future__ import annotations

from bergstream.core import sigv4

# "Examples of how to derive a signing key for Signature Version 4" (AWS General Reference).
DERIVATION_SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
DERIVED_KEY = "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"

# "Example: GET Object" (Amazon S3, Signature Calculations for the Authorization Header).
S3_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
S3_HEADERS = [
    ("host", "examplebucket.s3.amazonaws.com"),
    ("range", "bytes=0-9"),
    ("x-amz-content-sha256", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    ("x-amz-date", "20130524T000000Z"),
]
S3_CANONICAL_REQUEST = "\n".join(
    [
        "GET",
        "/test.txt",
        "",
        "host:examplebucket.s3.amazonaws.com",
        "range:bytes=0-9",
        "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "x-amz-date:20130524T000000Z",
        "",
        "host;range;x-amz-content-sha256;x-amz-date",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    ]
)
S3_STRING_TO_SIGN = "\n".join(
    [
        "AWS4-HMAC-SHA256",
        "20130524T000000Z",
        "20130524/us-east-1/s3/aws4_request",
        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972",
    ]
)
S3_SIGNATURE = "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"


def test_signing_key_derivation_matches_the_aws_example() -> None:
    key = sigv4.signing_key(DERIVATION_SECRET, "20120215", "us-east-1", "iam")
    assert key.hex() == DERIVED_KEY


def test_the_s3_get_object_example_step_by_step() -> None:
    assert S3_HEADERS[2][1] == sigv4.EMPTY_SHA256
    canonical = sigv4.canonical_request("GET", "/test.txt", "", S3_HEADERS, sigv4.EMPTY_SHA256)
    assert canonical == S3_CANONICAL_REQUEST
    scope = sigv4.credential_scope("20130524", "us-east-1", "s3")
    to_sign = sigv4.string_to_sign("20130524T000000Z", scope, canonical)
    assert to_sign == S3_STRING_TO_SIGN
    key = sigv4.signing_key(S3_SECRET, "20130524", "us-east-1", "s3")
    assert sigv4.signature(key, to_sign) == S3_SIGNATURE
    assert sigv4.signed_headers(S3_HEADERS) == "host;range;x-amz-content-sha256;x-amz-date"


def test_another_secret_date_or_header_gives_another_signature() -> None:
    def sign(secret: str, day: str, headers: list[tuple[str, str]]) -> str:
        canonical = sigv4.canonical_request("GET", "/test.txt", "", headers, sigv4.EMPTY_SHA256)
        scope = sigv4.credential_scope(day, "us-east-1", "s3")
        to_sign = sigv4.string_to_sign(f"{day}T000000Z", scope, canonical)
        return sigv4.signature(sigv4.signing_key(secret, day, "us-east-1", "s3"), to_sign)

    assert sign(S3_SECRET, "20130524", S3_HEADERS) == S3_SIGNATURE
    assert sign(S3_SECRET + "x", "20130524", S3_HEADERS) != S3_SIGNATURE
    assert sign(S3_SECRET, "20130525", S3_HEADERS) != S3_SIGNATURE
    changed = [*S3_HEADERS[:1], ("range", "bytes=0-10"), *S3_HEADERS[2:]]
    assert sign(S3_SECRET, "20130524", changed) != S3_SIGNATURE


def test_header_values_are_trimmed_and_inner_spaces_collapsed() -> None:
    spaced = [("host", "  h  "), ("x-amz-meta-a", "one   two\t three ")]
    canonical = sigv4.canonical_request("get", "", "a=1", spaced, sigv4.UNSIGNED_PAYLOAD)
    assert canonical.split("\n") == [
        "GET",
        "/",
        "a=1",
        "host:h",
        "x-amz-meta-a:one two three",
        "",
        "host;x-amz-meta-a",
        "UNSIGNED-PAYLOAD",
    ]
