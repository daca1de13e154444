// The TypeScript example client of clusterd, on Node 20 with connect-es over
// gRPC (HTTP/2). Like the Go, Java and Python examples, it creates a cluster,
// follows its operation to the end printing each step, provokes and decodes
// an ABORTED refusal (another operation holds the cluster: a simulator HOLD
// keeps the create running) and an INVALID_ARGUMENT, and prints
// "client typescript: ok". `make clients` generates gen/, compiles and runs it:
//
//   node clients/typescript/dist/src/client.js --addr 127.0.0.1:9090

import { create } from "@bufbuild/protobuf";
import { anyUnpack, DurationSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { parseArgs } from "node:util";

import {
  ClusterLifecycle,
  ClusterSchema,
  Cluster_State,
  type OperationMetadata,
  OperationMetadataSchema,
} from "../gen/clusterlifecycle/v1/clusterlifecycle_pb.js";
import { Fault_Mode, Simulator } from "../gen/clusterlifecycle/v1/simulator_pb.js";
import { type Operation, Operations } from "../gen/google/longrunning/operations_pb.js";
import { BadRequestSchema, ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";

/** The server did not behave as the contract says. */
class Failed extends Error {}

function metadataOf(op: Operation): OperationMetadata {
  const md = op.metadata && anyUnpack(op.metadata, OperationMetadataSchema);
  if (!md) {
    throw new Failed(`${op.name}: metadata is ${op.metadata?.typeUrl}, not OperationMetadata`);
  }
  return md;
}

/** Runs call, which must fail; returns its error as a ConnectError. */
async function refusal(call: () => Promise<unknown>, what: string): Promise<ConnectError> {
  try {
    await call();
  } catch (err) {
    return ConnectError.from(err);
  }
  throw new Failed(`${what} was accepted`);
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      addr: { type: "string", default: process.env.CLUSTERD_ADDR ?? "127.0.0.1:9090" },
      token: { type: "string", default: process.env.CLUSTERD_TOKEN ?? "" },
      account: { type: "string", default: process.env.CLUSTERD_ACCOUNT ?? "" },
    },
  });
  const headers: Record<string, string> = {};
  if (values.token) headers["authorization"] = `Bearer ${values.token}`;
  if (values.account) headers["x-clusterd-account"] = values.account;
  const transport = createGrpcTransport({
    baseUrl: `http://${values.addr}`,
    interceptors: [(next) => async (req) => {
      for (const [k, v] of Object.entries(headers)) req.header.set(k, v);
      return next(req);
    }],
  });
  const clusters = createClient(ClusterLifecycle, transport);
  const operations = createClient(Operations, transport);
  const simulator = createClient(Simulator, transport);
  const opts = { timeoutMs: 30_000 };

  // Hold the create at join_node, so that it is still running when the
  // second operation arrives.
  const fault = await simulator.injectFault({ fault: { step: "join_node", mode: Fault_Mode.HOLD, count: 1 } }, opts);
  const name = `client-typescript-${Date.now().toString(36)}`;
  let op = await clusters.createCluster(
    { cluster: { displayName: name, kubernetesVersion: "1.30.2", workerNodeCount: 2, serviceOffering: "medium" } },
    opts,
  );
  const cluster = metadataOf(op).cluster;
  console.log(`created ${cluster} (${name}) by ${op.name}`);
  for (const deadline = Date.now() + 60_000; ; await new Promise((r) => setTimeout(r, 20))) {
    const held = await simulator.listHeld({}, opts);
    if (held.held.some((h) => h.operation === op.name)) break;
    if (Date.now() > deadline) throw new Failed("the create never reached join_node");
  }
  console.log(`  ${op.name} held at join_node`);

  // A second operation while the create holds the cluster: ABORTED.
  const aborted = await refusal(() => clusters.stopCluster({ name: cluster }, opts), "stop during the create");
  const info = aborted.findDetails(ErrorInfoSchema)[0];
  if (aborted.code !== Code.Aborted || info?.reason !== "OPERATION_IN_PROGRESS") {
    throw new Failed(`stop during create = ${Code[aborted.code]} ${info?.reason}; want ABORTED OPERATION_IN_PROGRESS`);
  }
  console.log(`stop refused: ${Code[aborted.code]} ${info.reason} (held by ${info.metadata["operation"]})`);
  await simulator.releaseHeld({ fault: fault.name }, opts);

  // Follow the create to its end, printing each change of step.
  let last = "";
  for (;;) {
    op = await operations.waitOperation(
      { name: op.name, timeout: create(DurationSchema, { nanos: 200_000_000 }) },
      opts,
    );
    const md = metadataOf(op);
    const now = `step ${md.step}, ${md.stepsDone}/${md.stepsTotal} steps done`;
    if (now !== last) {
      console.log(`  ${md.verb}: ${now}`);
      last = now;
    }
    if (op.done) break;
  }
  if (op.result.case !== "response") {
    throw new Failed(`create failed: ${JSON.stringify(op.result.value)}`);
  }
  const created = anyUnpack(op.result.value, ClusterSchema);
  if (created?.state !== Cluster_State.RUNNING) {
    throw new Failed(`created cluster is ${created && Cluster_State[created.state]}; want RUNNING`);
  }
  console.log(`${created.name} is ${Cluster_State[created.state]}`);

  // An invalid request: INVALID_ARGUMENT with the field's path.
  const invalid = await refusal(
    () => clusters.createCluster(
      { cluster: { displayName: "Not_A_Label", kubernetesVersion: "1.30.2", workerNodeCount: 1, serviceOffering: "medium" } },
      opts,
    ),
    "an invalid display name",
  );
  const violation = invalid.findDetails(BadRequestSchema)[0]?.fieldViolations[0];
  if (invalid.code !== Code.InvalidArgument || violation?.field !== "cluster.display_name") {
    throw new Failed(`invalid create = ${Code[invalid.code]} ${violation?.field}; want INVALID_ARGUMENT on cluster.display_name`);
  }
  console.log(`invalid create refused: ${Code[invalid.code]} on ${violation.field}: ${violation.description}`);
  console.log("client typescript: ok");
}

main().catch((err: unknown) => {
  console.error(`client typescript: FAILED: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
});
