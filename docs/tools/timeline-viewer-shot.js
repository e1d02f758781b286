// Makes docs/timeline-viewer.png: a merged timeline opened in Chromium's DevTools
// (Performance panel, "Load profile"), three ranks' main threads expanded, one step
// zoomed in and a `ranks` bar selected. The clicks are at the positions of Chromium
// 156's DevTools in a 1600 x 900 window.
//
// The trace: a 3-rank job with rank 2 slow (kvstore-mpi's test fixture), e.g. (as root
// add --allow-run-as-root; on fewer than 3 cores, --oversubscribe)
//   KVSTORE_TIMELINE=$PWD/trace.json mpirun -np 3 -x KVSTORE_TIMELINE \
//       target/debug/fixture_slow_rank 2
// Then, with Debian's chromium and `npm install playwright-core@1`:
//   node docs/tools/timeline-viewer-shot.js trace.json docs/timeline-viewer.png
const { chromium } = require('playwright-core');

(async () => {
  const [trace, out] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = await browser.newPage({ viewport: { width: 1600, height: 900 } });
  await page.goto('devtools://devtools/bundled/devtools_app.html?panel=timeline', { waitUntil: 'commit' });
  await page.waitForSelector('text=Performance', { timeout: 20000 }).catch(() => {});
  await page.waitForTimeout(4000);
  // "Load profile".
  const [chooser] = await Promise.all([page.waitForEvent('filechooser', { timeout: 10000 }), page.mouse.click(108, 39)]);
  await chooser.setFiles(trace);
  await page.waitForTimeout(5000);
  await page.mouse.click(1571, 77); // the keyboard shortcuts' dialog, closed
  await page.waitForTimeout(300);
  await page.mouse.click(15, 40); // the sidebar, closed
  await page.waitForTimeout(800);
  // Each rank's process, then its main thread, expanded (from the bottom up: a row
  // opened moves the rows below it).
  for (const y of [170, 150, 129]) {
    await page.mouse.click(10, y);
    await page.waitForTimeout(400);
  }
  // A stretch of about 100 ms, chosen on the overview.
  await page.mouse.move(435, 75);
  await page.mouse.down();
  await page.mouse.move(560, 75, { steps: 10 });
  await page.mouse.up();
  await page.waitForTimeout(1000);
  for (const y of [264, 204, 145]) {
    await page.mouse.click(20, y);
    await page.waitForTimeout(400);
  }
  await page.mouse.click(956, 179); // rank 0's `ranks` bar: its summary below
  await page.waitForTimeout(800);
  await page.mouse.move(1500, 560);
  await page.waitForTimeout(500);
  await page.screenshot({ path: out });
  await browser.close();
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
