"""The OTEL_* variables the SDK reads by itself: checked before it reads them."""

from __future__ import annotations

import logging
import os
import re

import pytest

from otel_gpu.export import sdk_env
from otel_gpu.export.sdk_env import SdkEnvError


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("OTEL_METRIC_EXPORT_INTERVAL", "nan", "expected a finite number of milliseconds"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "7200000", "must be from 10ms to 1h"),
    ("OTEL_METRIC_EXPORT_TIMEOUT", "50", "must be from 100ms to 5m"),
    ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "0", "must be from 100ms to 5m (in seconds)"),
    ("OTEL_EXPORTER_OTLP_METRICS_INSECURE", "yes", "expected one of true, false"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli", "expected one of gzip, deflate, none"),
    ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "sometimes", "cumulative, delta"),
    ("OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES", "UNAVAILABLE,NOPE",
     "unknown gRPC status code 'NOPE'"),
])
def test_a_variable_standing_for_a_setting_is_refused_by_name(variable, value, message):
    with pytest.raises(SdkEnvError, match=rf"^{variable}: .*{re.escape(message)}"):
        sdk_env.check_otlp({variable: value})


def test_good_values_pass():
    env = {"OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5",
           "OTEL_EXPORTER_OTLP_INSECURE": "TRUE", "OTEL_ATTRIBUTE_COUNT_LIMIT": "64",
           "OTEL_METRICS_EXEMPLAR_FILTER": "always_off", "OTEL_SDK_DISABLED": "false",
           "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES": "unavailable",
           "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "host,otel"}
    assert sdk_env.check(env) == [] and sdk_env.check_otlp(env) == []


def test_an_ignorable_one_warns_and_is_taken_out_of_the_process_environment(
        monkeypatch, caplog):
    monkeypatch.setenv("OTEL_ATTRIBUTE_COUNT_LIMIT", "-1")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "maybe")
    with caplog.at_level(logging.WARNING, logger="otel_gpu.export.sdk_env"):
        sdk_env.settle(os.environ)
    assert "OTEL_ATTRIBUTE_COUNT_LIMIT" not in os.environ and "OTEL_SDK_DISABLED" not in os.environ
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert warnings[0].startswith("OTEL_SDK_DISABLED: expected one of true, false")
    assert "ignored, using the default (128)" in warnings[1]


def test_a_mapping_that_is_not_the_environment_is_left_alone(caplog):
    env = {"OTEL_METRICS_EXEMPLAR_FILTER": "garbage"}
    with caplog.at_level(logging.WARNING, logger="otel_gpu.export.sdk_env"):
        sdk_env.settle(env, sdk_env.OTLP)
    assert env == {"OTEL_METRICS_EXEMPLAR_FILTER": "garbage"}
    assert len(caplog.records) == 1
