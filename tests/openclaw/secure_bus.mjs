// The plugin's Kafka side (clients/openclaw/dist/src/bus.js) with the settings
// given as JSON in argv[2]: reads verdicts on its reply partition, publishes
// one event naming it, prints "published <partition>" and then each verdict
// it reads; its log lines (a refused connection among them) go to stderr.
// Runs until killed.
import { Bus } from "../../clients/openclaw/dist/src/bus.js";
import { parseSettings } from "../../clients/openclaw/dist/src/config.js";

const settings = parseSettings(JSON.parse(process.argv[2]));
const log = { debug() {}, info: (m) => console.error(m), warn: (m) => console.error(m) };
const bus = new Bus(settings, (value) => console.log(`verdict ${value}`), log, "secure-bus");
await bus.ready();
await bus.publish("secure-bus-run", {
  type: "tool_call", run_id: "secure-bus-run", seq: 0, tool_call_id: "c0", tool_name: "read", reply_partition: bus.replyPartition,
});
console.log(`published ${bus.replyPartition}`);
