"""MBLT: the canonical parsed-graph format (ONNX protobuf), its canonicalization and file I/O."""
