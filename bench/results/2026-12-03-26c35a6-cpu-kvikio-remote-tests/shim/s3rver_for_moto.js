// Test harness (outside ferry): s3rver standing in for moto's server, with moto-style keys.
const base = '/work/main/.cache/node/node_modules/s3rver';
// moto (us-east-1) answers 200 to creating a bucket its owner already has; s3rver says
// BucketAlreadyExists. KvikIO's tests create the same bucket in every test: behave as moto.
const bucketCtrl = require(base + '/lib/controllers/bucket');
const putBucket = bucketCtrl.putBucket;
bucketCtrl.putBucket = async (ctx) => {
  if (await ctx.store.getBucket(ctx.params.bucket)) {
    ctx.set('Location', '/' + ctx.params.bucket); ctx.body = ''; return;
  }
  return putBucket(ctx);
};
const S3rver = require(base);
const AWSAccount = require(base + '/lib/models/account');
const [address, port, directory, key, secret] = process.argv.slice(2);
AWSAccount.DUMMY_ACCOUNT.createKeyPair(key, secret);
new S3rver({ address, port: Number(port), directory, silent: true }).run((err, where) => {
  if (err) { console.error(err); process.exit(1); }
  console.log(`listening ${where.address}:${where.port}`);
});
