// Render the ```mermaid blocks (pymdownx.superfences emits them as <div class="mermaid">).
mermaid.initialize({ startOnLoad: true, theme: "neutral", flowchart: { wrappingWidth: 460 } });
