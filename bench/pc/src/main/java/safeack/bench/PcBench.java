package safeack.bench;

import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelConsumerOptions.CommitMode;
import io.confluent.parallelconsumer.ParallelConsumerOptions.ProcessingOrder;
import io.confluent.parallelconsumer.ParallelStreamProcessor;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.lang.management.ManagementFactory;
import java.lang.management.MemoryMXBean;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.LockSupport;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The safeack bench's Parallel Consumer contender. It consumes one topic from the
 * oldest offset in a fresh group, runs the bench's handler on every record (read the
 * record index from the first 8 value bytes, big endian; wait the index's work time
 * from the work file; index &lt; 0 is a warm-up record: no work, not counted), and
 * reports to the Go bench on stdout:
 *
 * <pre>
 * WARMUP &lt;ns&gt;                   (with warmup=) how long the unmeasured warm-up pass took
 * T0 &lt;unix ns&gt;                 just before the KafkaConsumer is built; every time below is ns after it
 * SUBSCRIBED &lt;ns&gt;               Parallel Consumer built, subscribe and poll called
 * FIRST &lt;ns&gt;                    the first record reached the handler
 * DONE last=&lt;ns&gt; cpu=&lt;ns&gt; heap=&lt;bytes&gt; rss=&lt;bytes&gt; busy=&lt;ns&gt; dups=&lt;n&gt;
 * CLOSED                        after stdin closed and the consumer was closed
 * </pre>
 *
 * Before DONE it writes the acks file: one big-endian long per record index, ns after
 * T0 of the record's first completion, +1 (0: never). It keeps consuming (and
 * committing) after DONE until stdin closes, so the bench can watch the commits.
 *
 * <p>Arguments are key=value: brokers, topic, group, ordering (KEY, UNORDERED,
 * PARTITION), concurrency, n, work (file of n big-endian longs, ns; empty: no work),
 * acks (output file), commit-interval-ms (default 1000), warmup (default 0: when
 * positive, first consume records 0..warmup-1 of warmup-topic (default: topic) with group
 * "&lt;group&gt;-warmup" and no work, unmeasured, so the measured pass runs on JIT-compiled
 * code).
 */
public final class PcBench {
  private static final Object OUT = new Object();
  private static long commitMs;

  public static void main(String[] args) throws Exception {
    Map<String, String> a = new HashMap<>();
    for (String s : args) {
      int eq = s.indexOf('=');
      if (eq <= 0) {
        die("argument " + s + " is not key=value");
      }
      a.put(s.substring(0, eq), s.substring(eq + 1));
    }
    String brokers = need(a, "brokers");
    String topic = need(a, "topic");
    String group = need(a, "group");
    ProcessingOrder order = ProcessingOrder.valueOf(need(a, "ordering"));
    int concurrency = Integer.parseInt(need(a, "concurrency"));
    int n = Integer.parseInt(need(a, "n"));
    Path acksPath = Path.of(need(a, "acks"));
    commitMs = Long.parseLong(a.getOrDefault("commit-interval-ms", "1000"));
    String workPath = a.getOrDefault("work", "");
    long[] work = workPath.isEmpty() ? null : readLongs(Path.of(workPath), n);

    int warmup = Integer.parseInt(a.getOrDefault("warmup", "0"));
    ProcessingOrder fOrder = order;

    com.sun.management.OperatingSystemMXBean os =
        (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    MemoryMXBean mem = ManagementFactory.getMemoryMXBean();

    if (warmup > 0) {
      // An unmeasured pass over the first records with another group and no
      // work, so the measured pass runs on warm (JIT-compiled) code, as a
      // long-running service would. UNORDERED: PARTITION order handles one
      // record at a time and would take long.
      long w0 = System.nanoTime();
      String warmTopic = a.getOrDefault("warmup-topic", topic);
      Pass warm = new Pass(brokers, warmTopic, group + "-warmup", ProcessingOrder.UNORDERED, concurrency, warmup, null, warmup);
      warm.done.await();
      warm.pc.closeDrainFirst(Duration.ofSeconds(10)); // nothing in flight: no InterruptedException logged
      System.gc();
      say("WARMUP " + (System.nanoTime() - w0));
    }

    resetPeakRss();
    AtomicLong heapPeak = new AtomicLong();
    Thread sampler =
        new Thread(
            () -> {
              while (true) {
                heapPeak.accumulateAndGet(mem.getHeapMemoryUsage().getUsed(), Math::max);
                try {
                  Thread.sleep(50);
                } catch (InterruptedException e) {
                  return;
                }
              }
            },
            "heap-sampler");
    sampler.setDaemon(true);

    long cpu0 = os.getProcessCpuTime();
    Pass pass = new Pass(brokers, topic, group, fOrder, concurrency, n, work, n, os, cpu0);
    long nowNano = System.nanoTime();
    Instant now = Instant.now();
    say("T0 " + (now.getEpochSecond() * 1_000_000_000L + now.getNano() - (nowNano - pass.t0)));
    sampler.start();
    pass.start();
    say("SUBSCRIBED " + (System.nanoTime() - pass.t0));

    pass.done.await();
    long rss = peakRss();
    try (DataOutputStream out =
        new DataOutputStream(new BufferedOutputStream(Files.newOutputStream(acksPath), 1 << 16))) {
      for (int i = 0; i < n; i++) {
        out.writeLong(pass.acked.get(i));
      }
    }
    say(
        String.format(
            "DONE last=%d cpu=%d heap=%d rss=%d busy=%d dups=%d",
            pass.last, pass.lastCpu, heapPeak.get(), rss, pass.busy.sum(), pass.dups.sum()));

    // Keep running (and committing) until the bench closes stdin.
    InputStream in = System.in;
    byte[] buf = new byte[256];
    while (in.read(buf) >= 0) {
      // discard
    }
    pass.pc.closeDrainFirst(Duration.ofSeconds(10)); // nothing is in flight any more
    say("CLOSED");
    System.exit(0);
  }

  /**
   * One consumer in one group until {@code target} distinct record indexes were
   * handled. Times are ns after {@link #t0}, taken just before the KafkaConsumer
   * is built.
   */
  static final class Pass {
    final long t0 = System.nanoTime();
    final AtomicLongArray acked;
    final AtomicInteger unique = new AtomicInteger();
    final AtomicLong first = new AtomicLong();
    final LongAdder busy = new LongAdder();
    final LongAdder dups = new LongAdder();
    final CountDownLatch done = new CountDownLatch(1);
    final ParallelStreamProcessor<byte[], byte[]> pc;
    final String topic;
    final int target;
    final long[] work;
    final boolean report;
    final com.sun.management.OperatingSystemMXBean os;
    final long cpu0;
    volatile long last;
    volatile long lastCpu;

    Pass(String brokers, String topic, String group, ProcessingOrder order, int concurrency,
        int target, long[] work, int n) {
      this(brokers, topic, group, order, concurrency, target, work, n, null, 0);
    }

    Pass(String brokers, String topic, String group, ProcessingOrder order, int concurrency,
        int target, long[] work, int n, com.sun.management.OperatingSystemMXBean os, long cpu0) {
      this.topic = topic;
      this.target = target;
      this.work = work;
      this.report = os != null;
      this.os = os;
      this.cpu0 = cpu0;
      this.acked = new AtomicLongArray(n);
      Properties p = new Properties();
      p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
      p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
      p.put(ConsumerConfig.CLIENT_ID_CONFIG, "safeack-bench-pc");
      p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false"); // Parallel Consumer commits
      p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
      p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
      p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
      KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p);
      ParallelConsumerOptions<byte[], byte[]> options =
          ParallelConsumerOptions.<byte[], byte[]>builder()
              .consumer(consumer)
              .ordering(order)
              .maxConcurrency(concurrency)
              .commitMode(CommitMode.PERIODIC_CONSUMER_ASYNCHRONOUS)
              .commitInterval(Duration.ofMillis(commitMs))
              // With kafka-clients 3.9 KafkaConsumer is a facade that PC 0.5.3.2's
              // reflective auto-commit check does not know; auto-commit is off above.
              .ignoreReflectiveAccessExceptionsForAutoCommitDisabledCheck(true)
              .build();
      pc = ParallelStreamProcessor.createEosStreamProcessor(options);
      if (!report) {
        start();
      }
    }

    void start() {
      pc.subscribe(List.of(topic));
      pc.poll(
          ctx -> {
            for (ConsumerRecord<byte[], byte[]> r : ctx.getConsumerRecordsFlattened()) {
              handle(r);
            }
          });
    }

    private void handle(ConsumerRecord<byte[], byte[]> r) {
      long began = System.nanoTime();
      if (first.get() == 0 && first.compareAndSet(0, began - t0 + 1) && report) {
        say("FIRST " + (began - t0));
      }
      byte[] v = r.value();
      if (v == null || v.length < 8) {
        return;
      }
      long idx = ByteBuffer.wrap(v, 0, 8).getLong();
      if (idx < 0) {
        return; // warm-up record of the steady workload
      }
      if (idx >= acked.length()) {
        dups.increment();
        return;
      }
      if (work != null) {
        long end = began + work[(int) idx];
        for (long left = end - System.nanoTime(); left > 0; left = end - System.nanoTime()) {
          LockSupport.parkNanos(left);
        }
      }
      long t = System.nanoTime();
      busy.add(t - began);
      if (acked.compareAndSet((int) idx, 0, t - t0 + 1)) {
        if (unique.incrementAndGet() == target) {
          last = t - t0;
          if (os != null) {
            lastCpu = os.getProcessCpuTime() - cpu0;
          }
          done.countDown();
        }
      } else {
        dups.increment();
      }
    }
  }

  private static void say(String line) {
    synchronized (OUT) {
      System.out.println(line);
      System.out.flush();
    }
  }

  private static String need(Map<String, String> a, String key) {
    String v = a.get(key);
    if (v == null) {
      die("missing argument " + key + "=");
    }
    return v;
  }

  private static void die(String msg) {
    System.err.println("pcbench: " + msg);
    System.exit(2);
  }

  private static long[] readLongs(Path path, int n) throws IOException {
    long[] out = new long[n];
    try (DataInputStream in = new DataInputStream(Files.newInputStream(path))) {
      for (int i = 0; i < n; i++) {
        out[i] = in.readLong();
      }
    }
    return out;
  }

  /** Resets the kernel's peak-RSS mark (Linux), so VmHWM is this run's peak. */
  private static void resetPeakRss() {
    try {
      Files.writeString(Path.of("/proc/self/clear_refs"), "5");
    } catch (IOException | RuntimeException e) {
      // not Linux, or not allowed: VmHWM stays the process lifetime peak
    }
  }

  private static long peakRss() {
    try {
      for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
        if (line.startsWith("VmHWM:")) {
          return Long.parseLong(line.substring(6).replace("kB", "").trim()) * 1024;
        }
      }
    } catch (IOException | RuntimeException e) {
      // unknown
    }
    return 0;
  }
}
