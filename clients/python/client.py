#!/usr/bin/python3
"""The Python example client of clusterd, on Debian's python3-grpcio.

Like the Go, Java and TypeScript examples, it creates a cluster, follows its
operation to the end printing each step, provokes and decodes an ABORTED
refusal (another operation holds the cluster: a simulator HOLD keeps the
create running) and an INVALID_ARGUMENT, and prints "client python: ok".
`make clients` generates its code into gen/ and runs it:

    /usr/bin/python3 clients/python/client.py --addr 127.0.0.1:9090
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen"))

import grpc  # noqa: E402
from google.protobuf import duration_pb2  # noqa: E402

from clusterlifecycle.v1 import clusterlifecycle_pb2 as cl  # noqa: E402
from clusterlifecycle.v1 import clusterlifecycle_pb2_grpc as cl_grpc  # noqa: E402
from clusterlifecycle.v1 import simulator_pb2 as sim  # noqa: E402
from clusterlifecycle.v1 import simulator_pb2_grpc as sim_grpc  # noqa: E402
from google.longrunning import operations_pb2 as ops  # noqa: E402
from google.longrunning import operations_pb2_grpc as ops_grpc  # noqa: E402
from google.rpc import error_details_pb2, status_pb2  # noqa: E402


class Failed(Exception):
    """The server did not behave as the contract says."""


def details(err):
    """Returns the google.rpc.Status of a failed call: its code, message and
    details (ErrorInfo, BadRequest) travel in the grpc-status-details-bin
    trailer."""
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            st = status_pb2.Status()
            st.ParseFromString(value)
            return st
    raise Failed(f"{err.code().name} {err.details()!r} carries no google.rpc.Status details")


def unpack(st, message_type):
    """Returns the first detail of st of message_type, or None."""
    for any_ in st.details:
        if any_.Is(message_type.DESCRIPTOR):
            out = message_type()
            any_.Unpack(out)
            return out
    return None


def metadata_of(op):
    md = cl.OperationMetadata()
    if not op.metadata.Unpack(md):
        raise Failed(f"{op.name}: metadata is {op.metadata.type_url}, not OperationMetadata")
    return md


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default=os.environ.get("CLUSTERD_ADDR", "127.0.0.1:9090"))
    parser.add_argument("--token", default=os.environ.get("CLUSTERD_TOKEN", ""))
    parser.add_argument("--account", default=os.environ.get("CLUSTERD_ACCOUNT", ""))
    args = parser.parse_args()
    call_md = []
    if args.token:
        call_md.append(("authorization", "Bearer " + args.token))
    if args.account:
        call_md.append(("x-clusterd-account", args.account))

    with grpc.insecure_channel(args.addr) as channel:
        clusters = cl_grpc.ClusterLifecycleStub(channel)
        operations = ops_grpc.OperationsStub(channel)
        simulator = sim_grpc.SimulatorStub(channel)
        kw = {"metadata": call_md, "timeout": 30}

        # Hold the create at join_node, so that it is still running when the
        # second operation arrives.
        fault = simulator.InjectFault(
            sim.InjectFaultRequest(fault=sim.Fault(step="join_node", mode=sim.Fault.HOLD, count=1)), **kw)
        name = "client-python-%x" % time.time_ns()
        op = clusters.CreateCluster(cl.CreateClusterRequest(cluster=cl.Cluster(
            display_name=name, kubernetes_version="1.30.2", worker_node_count=2, service_offering="medium")), **kw)
        cluster_name = metadata_of(op).cluster
        print(f"created {cluster_name} ({name}) by {op.name}")
        deadline = time.monotonic() + 60
        while not any(h.operation == op.name for h in simulator.ListHeld(sim.ListHeldRequest(), **kw).held):
            if time.monotonic() > deadline:
                raise Failed("the create never reached join_node")
            time.sleep(0.02)
        print(f"  {op.name} held at join_node")

        # A second operation while the create holds the cluster: ABORTED.
        try:
            clusters.StopCluster(cl.StopClusterRequest(name=cluster_name), **kw)
            raise Failed("stop during the create was accepted")
        except grpc.RpcError as err:
            info = unpack(details(err), error_details_pb2.ErrorInfo)
            if err.code() != grpc.StatusCode.ABORTED or info is None or info.reason != "OPERATION_IN_PROGRESS":
                raise Failed(f"stop during create = {err.code().name} {info}; want ABORTED OPERATION_IN_PROGRESS")
            print(f"stop refused: {err.code().name} {info.reason} (held by {info.metadata['operation']})")
        simulator.ReleaseHeld(sim.ReleaseHeldRequest(fault=fault.name), **kw)

        # Follow the create to its end, printing each change of step.
        last = None
        while True:
            op = operations.WaitOperation(
                ops.WaitOperationRequest(name=op.name, timeout=duration_pb2.Duration(nanos=200_000_000)), **kw)
            md = metadata_of(op)
            now = (md.step, md.steps_done, md.steps_total)
            if now != last:
                print(f"  {md.verb}: step {md.step}, {md.steps_done}/{md.steps_total} steps done")
                last = now
            if op.done:
                break
        if op.HasField("error"):
            raise Failed(f"create failed: {op.error}")
        cluster = cl.Cluster()
        op.response.Unpack(cluster)
        if cluster.state != cl.Cluster.RUNNING:
            raise Failed(f"created cluster is {cl.Cluster.State.Name(cluster.state)}; want RUNNING")
        print(f"{cluster.name} is {cl.Cluster.State.Name(cluster.state)}")

        # An invalid request: INVALID_ARGUMENT with the field's path.
        try:
            clusters.CreateCluster(cl.CreateClusterRequest(cluster=cl.Cluster(
                display_name="Not_A_Label", kubernetes_version="1.30.2", worker_node_count=1,
                service_offering="medium")), **kw)
            raise Failed("an invalid display name was accepted")
        except grpc.RpcError as err:
            bad = unpack(details(err), error_details_pb2.BadRequest)
            if err.code() != grpc.StatusCode.INVALID_ARGUMENT or bad is None or \
                    bad.field_violations[0].field != "cluster.display_name":
                raise Failed(f"invalid create = {err.code().name} {bad}; want INVALID_ARGUMENT on cluster.display_name")
            v = bad.field_violations[0]
            print(f"invalid create refused: {err.code().name} on {v.field}: {v.description}")
    print("client python: ok")


if __name__ == "__main__":
    try:
        main()
    except (Failed, grpc.RpcError) as e:
        print(f"client python: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
