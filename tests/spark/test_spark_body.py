"""Row -> body encoding and the publisher's option checks, without a JVM: tables of rows and exact bytes."""

import datetime
import decimal
import pickle

import pytest
from pyspark.sql import Row

from nsqpy.spark import PublishError, publish_partition
from nsqpy.spark.body import BodyEncoder
from nsqpy.spark.publisher import split_addresses

CASES = [
    # (column, json_rows, row, body)
    (None, False, b"raw", b"raw"),
    (None, False, bytearray(b"ba"), b"ba"),
    (None, False, "t\u00e9xt", "t\u00e9xt".encode()),
    (None, False, Row(value="only"), b"only"),
    (None, False, Row(id=1, body=b"named"), b"named"),
    ("s", False, Row(n=1, s="col"), b"col"),
    (0, False, (b"first", b"second"), b"first"),
    ("n", False, Row(n=42), b"42"),
    (None, True, Row(n=1, s="a", b=b"\x00\xff", d=decimal.Decimal("1.50"),
                     t=datetime.datetime(2026, 1, 2, 3, 4, 5), inner=Row(x=1)),
     b'{"n":1,"s":"a","b":"AP8=","d":"1.50","t":"2026-01-02T03:04:05","inner":{"x":1}}'),
    (None, True, {"k": [1, 2]}, b'{"k":[1,2]}'),
]


@pytest.mark.parametrize("column,json_rows,row,body", CASES)
def test_row_to_body(column, json_rows, row, body):
    assert BodyEncoder(column, json_rows).encode(row) == body


@pytest.mark.parametrize("column,row,error", [
    ("s", Row(s=None), ValueError),                  # NSQ has no empty messages
    ("s", Row(s=""), ValueError),
    (None, Row(a=1, b=2), TypeError),               # which column? say so
    ("a", Row(a=[1]), TypeError),
])
def test_bodies_nsq_cannot_carry_are_refused(column, row, error):
    with pytest.raises(error):
        BodyEncoder(column).encode(row)


def test_publisher_pickles_and_checks_its_options():
    publish = publish_partition("t", nsqd="127.0.0.1:4150, 10.0.0.2:4150", batch=100, column="body")
    clone = pickle.loads(pickle.dumps(publish))
    assert clone.nsqd == ["127.0.0.1:4150", "10.0.0.2:4150"] and clone.batch == 100
    assert split_addresses(["a:1", " ", "b:2 "]) == ["a:1", "b:2"]
    with pytest.raises(ValueError):
        publish_partition("t")                      # no address at all
    with pytest.raises(ValueError):
        publish_partition("t", nsqd=["no-port"])    # on the driver, not in every task


def test_an_unreachable_lookupd_is_a_publish_error():
    publish = publish_partition("t", lookupd=["127.0.0.1:1"], lookupd_timeout=0.5)
    with pytest.raises(PublishError, match="no nsqd from lookupd"):
        publish([b"x"])
