import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

// Built into the Python package: `mlxr serve` serves it under /ui/ with no Node at run time.
export default defineConfig({
  base: "/ui/",
  plugins: [react()],
  build: {
    outDir: "../mlxr/server/webui/static",
    emptyOutDir: true,
    chunkSizeWarningLimit: 1500,
  },
});
