#!/bin/sh
# Writes colibri_remote_pb2.py and colibri_remote_pb2_grpc.py from colibri_remote.proto (run it
# after changing the .proto; commit what it writes).  The committed files were made with
# grpcio-tools 1.63.0 (protoc 26.1): they need protobuf >= 5.26.1 and grpcio >= 1.63, the floors of
# pyproject's "remote" extra.  A newer grpcio-tools raises both floors to its own versions.
cd "$(dirname "$0")/../.." && exec "${PYTHON:-python3}" -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. colibri/remote/colibri_remote.proto
