/**
 * The gateway installation's instance id, which picks its reply partition when
 * `replyPartition` is not set: a random id kept in OpenClaw's state directory,
 * so the same installation reads the same partition across restarts, and
 * nothing of the host or the process shows in it.
 */

import { createHash, randomUUID } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/** Where, under OpenClaw's state directory, the id is kept. */
export const INSTANCE_FILE = join("loopwarden", "instance-id");

/**
 * The id in `<stateDir>/loopwarden/instance-id`, written (owner-only) the
 * first time. If the directory cannot be written, an id derived from the
 * state directory's path (stable too, but the same for two installations that
 * share a path on different machines); without a state directory, a random
 * id for this process.
 */
export function instanceId(stateDir: string | undefined): { id: string; warning?: string } {
  if (!stateDir) return { id: randomUUID(), warning: "no OpenClaw state directory: a new instance id (and reply partition) per process" };
  const file = join(stateDir, INSTANCE_FILE);
  try {
    const kept = readFileSync(file, "utf8").trim();
    if (kept) return { id: kept };
  } catch {
    // not written yet
  }
  try {
    const id = randomUUID();
    mkdirSync(join(stateDir, "loopwarden"), { recursive: true, mode: 0o700 });
    writeFileSync(file, `${id}\n`, { mode: 0o600, flag: "wx" });
    return { id };
  } catch (error) {
    // Another process of the same installation may have written it first.
    try {
      const kept = readFileSync(file, "utf8").trim();
      if (kept) return { id: kept };
    } catch {
      // fall through
    }
    const id = `state-${createHash("sha256").update(stateDir).digest("hex").slice(0, 32)}`;
    return { id, warning: `cannot keep an instance id in ${file} (${(error as NodeJS.ErrnoException).code ?? error}); using one derived from the state directory's path` };
  }
}
