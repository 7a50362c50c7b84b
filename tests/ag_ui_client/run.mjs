// Drives Keel's AG-UI endpoint with the official client (@ag-ui/client's HttpAgent) and prints
// one JSON object per line: {"kind": "event", "run": N, "event": ...} for every event the
// client accepted (after its own verification of the sequence), then {"kind": "done", ...}
// per run, or {"kind": "error", ...} when the client rejected the stream or the request.
//
//   node run.mjs URL --question TEXT [--thread ID] [--then approve|deny] [--save FILE]
//   node run.mjs URL --resume FILE --decision approve|deny [--save FILE]
//
// --then answers every interrupt of the first run and runs again (the same client, in memory);
// --save writes the thread (id, messages, pending interrupts) so another process can --resume.
import { readFileSync, writeFileSync } from "node:fs";
import { randomUUID } from "node:crypto";
import { HttpAgent, buildResumeArray } from "@ag-ui/client";

const [url, ...rest] = process.argv.slice(2);
const args = {};
for (let i = 0; i < rest.length; i += 2) args[rest[i].replace(/^--/, "")] = rest[i + 1];
const out = (value) => process.stdout.write(JSON.stringify(value) + "\n");
const headers = process.env.KEEL_TOKEN ? { Authorization: `Bearer ${process.env.KEEL_TOKEN}` } : {};

let agent;
if (args.resume) {
  const saved = JSON.parse(readFileSync(args.resume, "utf8"));
  agent = new HttpAgent({ url, headers, threadId: saved.threadId, initialMessages: saved.messages });
  agent.pendingInterrupts = saved.pendingInterrupts;
} else {
  agent = new HttpAgent({ url, headers, threadId: args.thread });
  agent.addMessage({ id: randomUUID(), role: "user", content: args.question });
}

function answers(decision) {
  const responses = {};
  for (const interrupt of agent.pendingInterrupts) {
    responses[interrupt.id] =
      decision === "approve"
        ? { status: "resolved", payload: { approved: true } }
        : { status: "resolved", payload: { approved: false, reason: "not in this repository" } };
  }
  return buildResumeArray(agent.pendingInterrupts, responses);
}

async function run(index, parameters) {
  const subscriber = { onEvent: ({ event }) => out({ kind: "event", run: index, event }) };
  try {
    const result = await agent.runAgent(parameters, subscriber);
    out({
      kind: "done",
      run: index,
      result: result.result ?? null,
      pendingInterrupts: agent.pendingInterrupts,
      messages: agent.messages,
    });
    return true;
  } catch (error) {
    out({ kind: "error", run: index, error: String(error?.message ?? error) });
    process.exitCode = 1;
    return false;
  }
}

let ok = await run(0, args.resume ? { resume: answers(args.decision) } : {});
if (ok && args.then && agent.pendingInterrupts.length > 0) {
  ok = await run(1, { resume: answers(args.then) });
}
if (args.save) {
  const thread = {
    threadId: agent.threadId,
    messages: agent.messages,
    pendingInterrupts: agent.pendingInterrupts,
  };
  writeFileSync(args.save, JSON.stringify(thread));
}
