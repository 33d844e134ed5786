// Written by Corral: every tool call is decided by the engine before it runs (fail closed).
import { spawnSync } from "node:child_process";
const HOOK = %(hook)s;
// OpenCode names an MCP tool `<server>_<tool>`; the engine knows it as `mcp__<server>__<tool>`.
const MCP = %(mcp)s;  // server names, longest first
const BUILTIN = new Set(%(builtin)s);
function named(tool) {
  if (BUILTIN.has(tool)) return tool;
  const server = MCP.find((s) => tool.startsWith(s + "_"));
  return server ? `mcp__${server}__${tool.slice(server.length + 1)}` : tool;
}
function ask(event, tool, args, sessionID, callID, cwd) {
  const payload = JSON.stringify({ hook_event_name: event, tool_name: named(tool),
                                   tool_input: args, session_id: sessionID,
                                   tool_use_id: callID, cwd: cwd });
  const r = spawnSync(HOOK[0], HOOK.slice(1), { input: payload, encoding: "utf8" });
  if (r.error) throw new Error("corral: tool call denied: governance unavailable (fail-closed)");
  return r;
}
export const CorralGovernance = async ({ directory }) => ({
  "tool.execute.before": async (input, output) => {
    const r = ask("PreToolUse", input.tool, output.args, input.sessionID, input.callID,
                  directory);
    if (r.status !== 0) throw new Error((r.stderr || "corral: tool call denied").trim());
  },
  "tool.execute.after": async (input, output) => {
    try {
      const payload = JSON.stringify({ hook_event_name: "PostToolUse",
                                       tool_name: named(input.tool),
                                       tool_response: (output && output.output) || "",
                                       session_id: input.sessionID, tool_use_id: input.callID });
      spawnSync(HOOK[0], HOOK.slice(1), { input: payload, encoding: "utf8" });
    } catch (e) {}
  },
});
