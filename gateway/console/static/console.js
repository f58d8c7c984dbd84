// The operator console's own script: the playground's stream reader and a stored response's replay.
// Served by the gateway (the CSP allows no other script); no build step, no dependency.
"use strict";

(function () {
  // --- SSE: frames split on a blank line (CR, LF or CRLF), each frame's event name and data ---------
  function SseDecoder() {
    this.buffer = "";
  }
  SseDecoder.prototype.feed = function (text) {
    this.buffer += text.replace(/\r\n?/g, "\n");
    const frames = [];
    let end;
    while ((end = this.buffer.indexOf("\n\n")) >= 0) {
      const block = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end + 2);
      let name = null;
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue; // a comment: the gateway's keep-alive
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") name = value;
        else if (field === "data") data.push(value);
      }
      if (data.length) frames.push({ event: name, data: data.join("\n") });
    }
    return frames;
  };

  // --- what a stream shows: text as it arrives, tool calls, every raw event --------------------
  function Output(root) {
    this.reply = root.querySelector("#reply");
    this.tools = root.querySelector("#tool-calls");
    this.raw = root.querySelector("#raw-events");
    this.status = root.querySelector("#status");
    this.blocks = {}; // a Messages stream's tool_use blocks by index: their input as it arrives
  }
  Output.prototype.clear = function () {
    this.reply.textContent = "";
    this.tools.textContent = "";
    this.raw.textContent = "";
    this.blocks = {};
    this.say("");
  };
  Output.prototype.say = function (text) {
    this.status.textContent = text;
  };
  Output.prototype.rawEvent = function (name, data) {
    this.raw.textContent += (name ? "event: " + name + "\n" : "") + "data: " + data + "\n\n";
    this.raw.scrollTop = this.raw.scrollHeight;
  };
  Output.prototype.toolCall = function (name, args, extra) {
    const item = document.createElement("li");
    const code = document.createElement("code");
    code.textContent = name + "(" + args + ")";
    item.appendChild(code);
    if (extra) item.appendChild(document.createTextNode(" " + extra));
    this.tools.appendChild(item);
  };
  // One parsed event of either API; returns true once the stream has ended.
  Output.prototype.event = function (event) {
    const type = event.type;
    if (type === "response.output_text.delta" || type === "response.refusal.delta") {
      this.reply.textContent += event.delta;
    } else if (type === "response.output_item.done" && event.item) {
      const item = event.item;
      if (item.type === "function_call") this.toolCall(item.name, item.arguments, "(call " + item.call_id + ")");
      else if (item.type === "mcp_call") this.toolCall(item.name, item.arguments, "on " + item.server_label + " → " + (item.output || item.error || ""));
    } else if (type === "content_block_start" && event.content_block && event.content_block.type === "tool_use") {
      this.blocks[event.index] = { name: event.content_block.name, id: event.content_block.id, input: "" };
    } else if (type === "content_block_delta" && event.delta) {
      if (event.delta.type === "text_delta") this.reply.textContent += event.delta.text;
      else if (event.delta.type === "input_json_delta" && this.blocks[event.index]) this.blocks[event.index].input += event.delta.partial_json;
    } else if (type === "content_block_stop" && this.blocks[event.index]) {
      const block = this.blocks[event.index];
      this.toolCall(block.name, block.input || "{}", "(tool_use " + block.id + ")");
      delete this.blocks[event.index];
    } else if (type === "response.completed" || type === "response.incomplete" || type === "message_stop") {
      this.say("Done: " + (event.response ? event.response.status : "stop") + ".");
      return true;
    } else if (type === "response.failed" || type === "error") {
      const error = (event.response && event.response.error) || event.error || {};
      this.say("Failed: " + (error.message || type) + ".");
      return true;
    }
    return false;
  };

  // --- the playground ----------------------------------------------------------------------------
  const SAMPLE_TOOL = {
    name: "get_weather",
    description: "The weather in a city now.",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  };

  function requestBody(api, model, prompt, tool) {
    if (api === "messages") {
      const body = { model: model, max_tokens: 512, stream: true, messages: [{ role: "user", content: prompt }] };
      if (tool) body.tools = [{ name: SAMPLE_TOOL.name, description: SAMPLE_TOOL.description, input_schema: SAMPLE_TOOL.parameters }];
      return body;
    }
    const body = { model: model, input: prompt, stream: true };
    if (tool) body.tools = [Object.assign({ type: "function" }, SAMPLE_TOOL)];
    return body;
  }

  async function run(form, output) {
    const api = form.querySelector("input[name=api]:checked").value;
    const body = requestBody(api, form.model.value.trim(), form.prompt.value, form.tool.checked);
    const token = document.querySelector("meta[name=csrf-token]");
    output.clear();
    output.say("Streaming…");
    const answer = await fetch("/console/playground/" + api, {
      method: "POST",
      headers: { "content-type": "application/json", "x-csrf-token": token ? token.content : "" },
      body: JSON.stringify(body),
      credentials: "same-origin",
    });
    if (!answer.ok || !answer.body) {
      const text = await answer.text();
      output.rawEvent(null, text);
      output.say("The gateway answered " + answer.status + ".");
      return;
    }
    const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
    const decoder = new SseDecoder();
    let ended = false;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      for (const frame of decoder.feed(value)) {
        output.rawEvent(frame.event, frame.data);
        if (frame.data === "[DONE]") continue;
        try {
          ended = output.event(JSON.parse(frame.data)) || ended;
        } catch (error) {
          output.say("An event that is not JSON: " + error);
        }
      }
    }
    if (!ended) output.say("The stream ended.");
  }

  function playground() {
    const form = document.getElementById("playground");
    if (!form) return;
    const output = new Output(document);
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      const send = form.querySelector("#send");
      send.disabled = true;
      run(form, output)
        .catch(function (error) {
          output.say("The request failed: " + error);
        })
        .finally(function () {
          send.disabled = false;
        });
    });
  }

  // --- a stored response's replay: its events played in order ---------------------------------
  function replay() {
    const button = document.getElementById("replay");
    if (!button) return;
    const output = new Output(document);
    button.addEventListener("click", function () {
      const events = JSON.parse(document.getElementById(button.dataset.events).textContent);
      output.clear();
      output.say("Replaying " + events.length + " events…");
      button.disabled = true;
      let next = 0;
      function step() {
        // A few events a frame: a long log replays in seconds, still in order.
        for (let n = 0; n < 4 && next < events.length; n++, next++) {
          const event = events[next];
          output.rawEvent(event.type, JSON.stringify(event));
          output.event(event);
        }
        if (next < events.length) window.setTimeout(step, 16);
        else {
          output.say("Replayed " + events.length + " events.");
          button.disabled = false;
        }
      }
      step();
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    playground();
    replay();
  });
})();
