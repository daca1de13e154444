package dev.clusterd.example;

import com.google.longrunning.Operation;
import com.google.longrunning.OperationsGrpc;
import com.google.longrunning.WaitOperationRequest;
import com.google.protobuf.Any;
import com.google.protobuf.Duration;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.BadRequest;
import com.google.rpc.ErrorInfo;
import dev.clusterd.clusterlifecycle.v1.Cluster;
import dev.clusterd.clusterlifecycle.v1.ClusterLifecycleGrpc;
import dev.clusterd.clusterlifecycle.v1.CreateClusterRequest;
import dev.clusterd.clusterlifecycle.v1.Fault;
import dev.clusterd.clusterlifecycle.v1.HeldStep;
import dev.clusterd.clusterlifecycle.v1.InjectFaultRequest;
import dev.clusterd.clusterlifecycle.v1.ListHeldRequest;
import dev.clusterd.clusterlifecycle.v1.OperationMetadata;
import dev.clusterd.clusterlifecycle.v1.ReleaseHeldRequest;
import dev.clusterd.clusterlifecycle.v1.SimulatorGrpc;
import dev.clusterd.clusterlifecycle.v1.StopClusterRequest;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import io.grpc.stub.AbstractStub;
import io.grpc.stub.MetadataUtils;
import java.util.Optional;
import java.util.concurrent.TimeUnit;

/**
 * The Java example client of clusterd, on Debian's grpc-java 1.41. Like the Go, TypeScript and
 * Python examples, it creates a cluster, follows its operation to the end printing each step,
 * provokes and decodes an ABORTED refusal (another operation holds the cluster: a simulator HOLD
 * keeps the create running) and an INVALID_ARGUMENT, and prints "client java: ok". {@code make
 * clients} generates its code, compiles and runs it:
 *
 * <pre>java -cp "$(cat clients/java/build/classpath)" dev.clusterd.example.Client --addr 127.0.0.1:9090</pre>
 */
public final class Client {
  /** The server did not behave as the contract says. */
  static final class Failed extends Exception {
    Failed(String message) {
      super(message);
    }
  }

  private Client() {}

  public static void main(String[] args) throws Exception {
    String addr = env("CLUSTERD_ADDR", "127.0.0.1:9090");
    String token = env("CLUSTERD_TOKEN", "");
    String account = env("CLUSTERD_ACCOUNT", "");
    for (int i = 0; i + 1 < args.length; i += 2) {
      switch (args[i]) {
        case "--addr" -> addr = args[i + 1];
        case "--token" -> token = args[i + 1];
        case "--account" -> account = args[i + 1];
        default -> throw new IllegalArgumentException("unknown flag " + args[i]);
      }
    }
    ManagedChannel channel = ManagedChannelBuilder.forTarget(addr).usePlaintext().build();
    try {
      run(channel, token, account);
      System.out.println("client java: ok");
    } catch (Failed | StatusRuntimeException e) {
      System.err.println("client java: FAILED: " + e.getMessage());
      System.exit(1);
    } finally {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
  }

  private static String env(String key, String def) {
    String v = System.getenv(key);
    return v == null || v.isEmpty() ? def : v;
  }

  /** Adds the credentials of a call: a bearer token, or the account of development mode. */
  private static <S extends AbstractStub<S>> S withHeaders(S stub, String token, String account) {
    Metadata headers = new Metadata();
    if (!token.isEmpty()) {
      headers.put(Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer " + token);
    }
    if (!account.isEmpty()) {
      headers.put(Metadata.Key.of("x-clusterd-account", Metadata.ASCII_STRING_MARSHALLER), account);
    }
    return stub.withInterceptors(MetadataUtils.newAttachHeadersInterceptor(headers));
  }

  /** Returns the first detail of type in the google.rpc.Status a failed call carries. */
  private static <T extends com.google.protobuf.Message> Optional<T> detail(StatusRuntimeException e, Class<T> type)
      throws InvalidProtocolBufferException {
    com.google.rpc.Status st = StatusProto.fromThrowable(e);
    if (st == null) {
      return Optional.empty();
    }
    for (Any any : st.getDetailsList()) {
      if (any.is(type)) {
        return Optional.of(any.unpack(type));
      }
    }
    return Optional.empty();
  }

  private static void run(ManagedChannel channel, String token, String account) throws Exception {
    var clusters = withHeaders(ClusterLifecycleGrpc.newBlockingStub(channel), token, account);
    var operations = withHeaders(OperationsGrpc.newBlockingStub(channel), token, account);
    var simulator = withHeaders(SimulatorGrpc.newBlockingStub(channel), token, account);

    // Hold the create at join_node, so that it is still running when the second operation arrives.
    Fault fault = simulator.withDeadlineAfter(30, TimeUnit.SECONDS).injectFault(InjectFaultRequest.newBuilder()
        .setFault(Fault.newBuilder().setStep("join_node").setMode(Fault.Mode.HOLD).setCount(1)).build());
    String name = "client-java-" + Long.toString(System.nanoTime(), 36);
    Operation op = clusters.withDeadlineAfter(30, TimeUnit.SECONDS).createCluster(CreateClusterRequest.newBuilder()
        .setCluster(Cluster.newBuilder().setDisplayName(name).setKubernetesVersion("1.30.2")
            .setWorkerNodeCount(2).setServiceOffering("medium"))
        .build());
    String cluster = op.getMetadata().unpack(OperationMetadata.class).getCluster();
    System.out.printf("created %s (%s) by %s%n", cluster, name, op.getName());
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
    while (true) {
      String opName = op.getName();
      boolean held = simulator.withDeadlineAfter(30, TimeUnit.SECONDS).listHeld(ListHeldRequest.getDefaultInstance())
          .getHeldList().stream().map(HeldStep::getOperation).anyMatch(opName::equals);
      if (held) {
        break;
      }
      if (System.nanoTime() > deadline) {
        throw new Failed("the create never reached join_node");
      }
      Thread.sleep(20);
    }
    System.out.printf("  %s held at join_node%n", op.getName());

    // A second operation while the create holds the cluster: ABORTED.
    try {
      clusters.withDeadlineAfter(30, TimeUnit.SECONDS).stopCluster(StopClusterRequest.newBuilder().setName(cluster).build());
      throw new Failed("stop during the create was accepted");
    } catch (StatusRuntimeException e) {
      Optional<ErrorInfo> info = detail(e, ErrorInfo.class);
      if (e.getStatus().getCode() != Status.Code.ABORTED || info.isEmpty()
          || !info.get().getReason().equals("OPERATION_IN_PROGRESS")) {
        throw new Failed("stop during create = " + e.getStatus() + " " + info + "; want ABORTED OPERATION_IN_PROGRESS");
      }
      System.out.printf("stop refused: %s %s (held by %s)%n", e.getStatus().getCode(), info.get().getReason(),
          info.get().getMetadataOrDefault("operation", "?"));
    }
    simulator.withDeadlineAfter(30, TimeUnit.SECONDS).releaseHeld(ReleaseHeldRequest.newBuilder().setFault(fault.getName()).build());

    // Follow the create to its end, printing each change of step.
    String last = "";
    while (true) {
      op = operations.withDeadlineAfter(30, TimeUnit.SECONDS).waitOperation(WaitOperationRequest.newBuilder()
          .setName(op.getName()).setTimeout(Duration.newBuilder().setNanos(200_000_000)).build());
      OperationMetadata md = op.getMetadata().unpack(OperationMetadata.class);
      String now = String.format("step %s, %d/%d steps done", md.getStep(), md.getStepsDone(), md.getStepsTotal());
      if (!now.equals(last)) {
        System.out.printf("  %s: %s%n", md.getVerb(), now);
        last = now;
      }
      if (op.getDone()) {
        break;
      }
    }
    if (op.hasError()) {
      throw new Failed("create failed: " + op.getError());
    }
    Cluster created = op.getResponse().unpack(Cluster.class);
    if (created.getState() != Cluster.State.RUNNING) {
      throw new Failed("created cluster is " + created.getState() + "; want RUNNING");
    }
    System.out.printf("%s is %s%n", created.getName(), created.getState());

    // An invalid request: INVALID_ARGUMENT with the field's path.
    try {
      clusters.withDeadlineAfter(30, TimeUnit.SECONDS).createCluster(CreateClusterRequest.newBuilder()
          .setCluster(Cluster.newBuilder().setDisplayName("Not_A_Label").setKubernetesVersion("1.30.2")
              .setWorkerNodeCount(1).setServiceOffering("medium"))
          .build());
      throw new Failed("an invalid display name was accepted");
    } catch (StatusRuntimeException e) {
      Optional<BadRequest> bad = detail(e, BadRequest.class);
      if (e.getStatus().getCode() != Status.Code.INVALID_ARGUMENT || bad.isEmpty()
          || bad.get().getFieldViolationsCount() == 0
          || !bad.get().getFieldViolations(0).getField().equals("cluster.display_name")) {
        throw new Failed("invalid create = " + e.getStatus() + " " + bad + "; want INVALID_ARGUMENT on cluster.display_name");
      }
      BadRequest.FieldViolation v = bad.get().getFieldViolations(0);
      System.out.printf("invalid create refused: %s on %s: %s%n", e.getStatus().getCode(), v.getField(), v.getDescription());
    }
  }
}
