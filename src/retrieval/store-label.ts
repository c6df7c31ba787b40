/**
 * The store's URL without its password, for logs and reports. Apart from open-store.ts, which loads both
 * stores' code (faiss among it): a caller that only names the store loads neither.
 */
export function storeLabel(store: string): string {
  if (store === 'faiss') return 'faiss';
  try {
    const u = new URL(store);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return 'postgres';
  }
}
