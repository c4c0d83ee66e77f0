package safeack.bench;

import java.io.BufferedOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.PrintStream;
import java.lang.management.ManagementFactory;
import java.lang.management.MemoryMXBean;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The safeack bench's Java share-consumer contender: one Apache Kafka {@link
 * KafkaShareConsumer} (explicit acknowledgement) with a pool of {@code conc} worker
 * threads, the usual explicit-ack loop: poll, hand every record to the pool, wait for
 * all of them, acknowledge each (ACCEPT, or REJECT for a poison record), poll again (the
 * acknowledgements ride on that poll's ShareFetch).
 *
 * <p>The handler reads the record index from the first 8 value bytes (big endian; -1
 * when shorter), waits the work time and fails a poison record (index % poison-every =
 * poison-every - 1), as the Go share member's handler does.
 *
 * <p>It speaks the Go share member's protocol on stdout (bench/share.go, runShareMember):
 *
 * <pre>
 * FIRST &lt;unix ns&gt;                                    the first delivery
 * A &lt;index&gt; &lt;unix ns&gt; &lt;busy ns&gt; &lt;poisoned 0|1&gt;     a record acknowledged
 * DONE &lt;cpu ns&gt; &lt;heap bytes&gt; &lt;rss bytes&gt;           after stdin closed
 * ERR &lt;message&gt;                                       it gave up
 * </pre>
 *
 * <p>When stdin closes it stops polling, closes the consumer (which sends the last
 * acknowledgements) and prints DONE: its CPU time from the JVM's start, its peak heap in
 * use (sampled every 50 ms) and its peak RSS.
 *
 * <p>Arguments are key=value: brokers, topic, group (the share group; its
 * share.auto.offset.reset is set to earliest first, with the Admin client), conc, work-ns
 * (default 0), poison-every (default 0: none), verbose (true: print the polls' record
 * counts to stderr at the end), and prop.&lt;name&gt;=&lt;value&gt; for any consumer
 * property (e.g. prop.max.poll.records=256; default: the client's defaults).
 */
public final class ShareBench {
  private static final PrintStream OUT =
      new PrintStream(new BufferedOutputStream(new FileOutputStream(FileDescriptor.out), 1 << 16), false);
  private static final long NANO0 = System.nanoTime();
  private static final long UNIX0;

  static {
    Instant now = Instant.now();
    UNIX0 = now.getEpochSecond() * 1_000_000_000L + now.getNano();
  }

  private static long unixNanos(long nano) {
    return UNIX0 + (nano - NANO0);
  }

  private static volatile boolean stopping;

  public static void main(String[] args) {
    try {
      run(args);
    } catch (Throwable t) {
      String msg = String.valueOf(t).replace('\n', ' ');
      synchronized (OUT) {
        OUT.println("ERR " + msg);
        OUT.flush();
      }
      t.printStackTrace();
      System.exit(1);
    }
  }

  private static void run(String[] args) throws Exception {
    Map<String, String> a = new HashMap<>();
    for (String s : args) {
      int eq = s.indexOf('=');
      if (eq <= 0) {
        throw new IllegalArgumentException("argument " + s + " is not key=value");
      }
      a.put(s.substring(0, eq), s.substring(eq + 1));
    }
    String brokers = need(a, "brokers");
    String topic = need(a, "topic");
    String group = need(a, "group");
    int conc = Integer.parseInt(need(a, "conc"));
    long workNs = Long.parseLong(a.getOrDefault("work-ns", "0"));
    int poisonEvery = Integer.parseInt(a.getOrDefault("poison-every", "0"));
    boolean verbose = Boolean.parseBoolean(a.getOrDefault("verbose", "false"));
    long polls = 0;
    long polled = 0;
    int largest = 0;

    com.sun.management.OperatingSystemMXBean os =
        (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    MemoryMXBean mem = ManagementFactory.getMemoryMXBean();
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
    sampler.start();

    // The share group reads from the oldest record, as the Go share member's
    // InitialOffset oldest makes it (both set the group's config the same way).
    Properties ap = new Properties();
    ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    ap.put(AdminClientConfig.CLIENT_ID_CONFIG, "safeack-bench-jshare-admin");
    try (Admin admin = Admin.create(ap)) {
      admin
          .incrementalAlterConfigs(
              Map.of(
                  new ConfigResource(ConfigResource.Type.GROUP, group),
                  List.of(
                      new AlterConfigOp(
                          new ConfigEntry("share.auto.offset.reset", "earliest"), AlterConfigOp.OpType.SET))))
          .all()
          .get(30, TimeUnit.SECONDS);
    }

    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.CLIENT_ID_CONFIG, "safeack-bench-jshare");
    p.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, "explicit");
    for (Map.Entry<String, String> e : a.entrySet()) {
      if (e.getKey().startsWith("prop.")) {
        p.put(e.getKey().substring(5), e.getValue());
      }
    }
    ByteArrayDeserializer de = new ByteArrayDeserializer();
    KafkaShareConsumer<byte[], byte[]> consumer = new KafkaShareConsumer<>(p, de, de);
    consumer.subscribe(List.of(topic));

    ExecutorService pool =
        Executors.newFixedThreadPool(
            conc,
            r -> {
              Thread t = new Thread(r, "handler");
              t.setDaemon(true);
              return t;
            });

    Thread in =
        new Thread(
            () -> {
              InputStream s = System.in;
              byte[] buf = new byte[256];
              try {
                while (s.read(buf) >= 0) {
                  // discard
                }
              } catch (IOException e) {
                // closed
              }
              stopping = true;
              consumer.wakeup();
            },
            "stdin");
    in.setDaemon(true);
    in.start();

    boolean first = true;
    List<ConsumerRecord<byte[], byte[]>> batch = new ArrayList<>();
    while (!stopping) {
      ConsumerRecords<byte[], byte[]> recs;
      try {
        recs = consumer.poll(Duration.ofMillis(500));
      } catch (WakeupException e) {
        break;
      }
      if (recs.isEmpty()) {
        continue;
      }
      if (first) {
        first = false;
        say("FIRST " + unixNanos(System.nanoTime()));
      }
      batch.clear();
      recs.forEach(batch::add);
      int n = batch.size();
      polls++;
      polled += n;
      largest = Math.max(largest, n);
      int[] index = new int[n];
      long[] busy = new long[n];
      boolean[] poisoned = new boolean[n];
      CountDownLatch left = new CountDownLatch(n);
      for (int k = 0; k < n; k++) {
        final int j = k;
        final byte[] v = batch.get(k).value();
        pool.execute(
            () -> {
              long began = System.nanoTime();
              try {
                if (workNs > 0) {
                  long end = began + workNs;
                  for (long rest = workNs; rest > 0; rest = end - System.nanoTime()) {
                    LockSupport.parkNanos(rest);
                  }
                }
                int i = v == null || v.length < 8 ? -1 : (int) ByteBuffer.wrap(v, 0, 8).getLong();
                index[j] = i;
                poisoned[j] = poisonEvery > 0 && i >= 0 && i % poisonEvery == poisonEvery - 1;
                busy[j] = System.nanoTime() - began;
              } finally {
                left.countDown();
              }
            });
      }
      left.await();
      // The handlers are done: acknowledge every record of the poll (explicit
      // mode requires it before the next poll), REJECT for a poison record.
      for (int k = 0; k < n; k++) {
        consumer.acknowledge(batch.get(k), poisoned[k] ? AcknowledgeType.REJECT : AcknowledgeType.ACCEPT);
        OUT.print("A ");
        OUT.print(index[k]);
        OUT.print(' ');
        OUT.print(unixNanos(System.nanoTime()));
        OUT.print(' ');
        OUT.print(busy[k]);
        OUT.print(poisoned[k] ? " 1\n" : " 0\n");
      }
      synchronized (OUT) {
        OUT.flush();
      }
    }
    long cpu = os.getProcessCpuTime();
    long heap = heapPeak.get();
    if (verbose) {
      System.err.printf(
          "jshare %s: %d polls with records, %d records, %.1f per poll, largest %d%n",
          group, polls, polled, polls == 0 ? 0.0 : (double) polled / polls, largest);
    }
    consumer.close(Duration.ofSeconds(10));
    pool.shutdownNow();
    say("DONE " + cpu + " " + heap + " " + peakRss());
    System.exit(0);
  }

  private static void say(String line) {
    synchronized (OUT) {
      OUT.println(line);
      OUT.flush();
    }
  }

  private static String need(Map<String, String> a, String key) {
    String v = a.get(key);
    if (v == null) {
      throw new IllegalArgumentException("missing argument " + key + "=");
    }
    return v;
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
